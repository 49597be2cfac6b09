//go:build cudah

package cuda

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestLayoutAgainstCUDAHeader compiles a C program against an installed
// cuda.h and compares every size and offset it prints with the Go
// mirrors. It runs with `go test -tags cudah ./driver/cuda` on a machine
// with the CUDA toolkit ($CUDA_HOME/include, else /usr/local/cuda/include);
// it skips where there is no cuda.h. No header is copied into the
// repository: this checks the one the machine has.
func TestLayoutAgainstCUDAHeader(t *testing.T) {
	home := os.Getenv("CUDA_HOME")
	if home == "" {
		home = "/usr/local/cuda"
	}
	inc := filepath.Join(home, "include")
	if _, err := os.Stat(filepath.Join(inc, "cuda.h")); err != nil {
		t.Skipf("no cuda.h under %s (set CUDA_HOME): %v", inc, err)
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "layout.c")
	require.NoError(t, os.WriteFile(src, []byte(`#include <stdio.h>
#include <stddef.h>
#include <cuda.h>
#define S(t) printf(#t " %zu %zu\n", sizeof(t), _Alignof(t))
#define O(t, f) printf(#t "." #f " %zu\n", offsetof(t, f))
int main(void) {
	S(CUmemLocation); O(CUmemLocation, type); O(CUmemLocation, id);
	S(CUmemAllocationProp); O(CUmemAllocationProp, type); O(CUmemAllocationProp, requestedHandleTypes);
	O(CUmemAllocationProp, location); O(CUmemAllocationProp, win32HandleMetaData); O(CUmemAllocationProp, allocFlags);
	S(CUmemAccessDesc); O(CUmemAccessDesc, location); O(CUmemAccessDesc, flags);
	printf("CUdeviceptr %zu\nCUmemGenericAllocationHandle %zu\nCUresult %zu\n",
		sizeof(CUdeviceptr), sizeof(CUmemGenericAllocationHandle), sizeof(CUresult));
	return 0;
}
`), 0o644))
	bin := filepath.Join(dir, "layout")
	out, err := exec.Command(cc, "-I", inc, "-o", bin, src).CombinedOutput()
	require.NoError(t, err, "compile against %s: %s", inc, out)
	out, err = exec.Command(bin).Output()
	require.NoError(t, err)
	got := map[string][]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		for _, v := range f[1:] {
			n, err := strconv.ParseUint(v, 10, 64)
			require.NoError(t, err)
			got[f[0]] = append(got[f[0]], n)
		}
	}
	var loc memLocation
	var p memAllocationProp
	var a memAccessDesc
	want := map[string][]uint64{
		"CUmemLocation":                            {uint64(unsafe.Sizeof(loc)), uint64(unsafe.Alignof(loc))},
		"CUmemLocation.type":                       {uint64(unsafe.Offsetof(loc.typ))},
		"CUmemLocation.id":                         {uint64(unsafe.Offsetof(loc.id))},
		"CUmemAllocationProp":                      {uint64(unsafe.Sizeof(p)), uint64(unsafe.Alignof(p))},
		"CUmemAllocationProp.type":                 {uint64(unsafe.Offsetof(p.typ))},
		"CUmemAllocationProp.requestedHandleTypes": {uint64(unsafe.Offsetof(p.requestedHandleTypes))},
		"CUmemAllocationProp.location":             {uint64(unsafe.Offsetof(p.location))},
		"CUmemAllocationProp.win32HandleMetaData":  {uint64(unsafe.Offsetof(p.win32HandleMetaData))},
		"CUmemAllocationProp.allocFlags":           {uint64(unsafe.Offsetof(p.allocFlags))},
		"CUmemAccessDesc":                          {uint64(unsafe.Sizeof(a)), uint64(unsafe.Alignof(a))},
		"CUmemAccessDesc.location":                 {uint64(unsafe.Offsetof(a.location))},
		"CUmemAccessDesc.flags":                    {uint64(unsafe.Offsetof(a.flags))},
		"CUdeviceptr":                              {8},
		"CUmemGenericAllocationHandle":             {8},
		"CUresult":                                 {4},
	}
	require.Equal(t, want, got)
}
