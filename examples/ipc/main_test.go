package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// TestMain plays the consumer, through realMain, when run re-executes the
// test binary (what os.Executable names under go test) with the socket in
// its environment.
func TestMain(m *testing.M) {
	if _, ok := os.LookupEnv(consumerEnv); ok {
		os.Exit(realMain(nil, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestRun checks that a second process imported the chunk, that its
// checksum is the producer's, that its write shows in the producer's
// mapping, and that the time from export to its first read is printed;
// off Linux, that it answers ErrUnsupported.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	if runtime.GOOS != "linux" {
		drivertest.RequireIs(t, run(&out), driver.ErrUnsupported, "needs Linux")
		return
	}
	require.NoError(t, run(&out))
	s := out.String()
	t.Log("\n" + s)

	require.Regexp(t, `producer \(pid \d+\): a float32 tensor \[1024 1024\], 4 MiB, in a shareable chunk mapped read-write at 0x[0-9a-f]+\n`, s)
	require.Contains(t, s, "producer (pid "+strconv.Itoa(os.Getpid())+")")
	m := regexp.MustCompile(`consumer \(pid (\d+)\): started from \S+, connected on producer.sock \(mode 0600\); SO_PEERCRED says pid (\d+)\n`).FindStringSubmatch(s)
	require.NotNil(t, m, s)
	require.Equal(t, m[1], m[2], "the kernel names the consumer")
	require.NotEqual(t, strconv.Itoa(os.Getpid()), m[1], "the consumer is another process")
	require.Contains(t, s, "producer: exported the chunk to pid "+m[1]+" alone and sent it as a file descriptor\n")
	require.Regexp(t, `consumer: imported 4 MiB, mapped it read-write at 0x[0-9a-f]+, read the tensor where it lies \(first element -512\), wrote -1 to element \[1023 1023\]\n`, s)

	sums := regexp.MustCompile(`(?m)^(producer|consumer) checksum: (0x[0-9a-f]{16})$`).FindAllStringSubmatch(s, -1)
	require.Len(t, sums, 2, s)
	require.Equal(t, "producer", sums[0][1])
	require.Equal(t, "consumer", sums[1][1])
	require.Equal(t, sums[0][2], sums[1][2], "the consumer read what the producer wrote")

	require.Contains(t, s, "element [1023 1023] in the producer's mapping, after the consumer exited: -1\n")
	require.Contains(t, s, "no bytes copied: both processes map the same memory\n")
	e := regexp.MustCompile(`export to the consumer's first read: (\S+) \(export, send, import, map, grant access, first element read\)\n`).FindStringSubmatch(s)
	require.NotNil(t, e, s)
	d, err := time.ParseDuration(e[1])
	require.NoError(t, err)
	require.Positive(t, d)
}

// TestArgs: the example takes no argument; one is a line on stderr and
// exit status 2, -h the usage and status 0.
func TestArgs(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Equal(t, 2, realMain([]string{"extra"}, &stdout, &stderr))
	require.Equal(t, "ipc: unexpected argument \"extra\"; the example takes none\n", stderr.String())
	require.Empty(t, stdout.String())
	stderr.Reset()
	require.Equal(t, 2, realMain([]string{"-rows", "5"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "flag provided but not defined: -rows")
	require.Equal(t, 0, realMain([]string{"-h"}, &stdout, &stderr))
	require.Empty(t, stdout.String())
}

// TestFailureIsOneLine: a failure of the producer or of the consumer is
// one line on stderr with the cause, no stack, and exit status 1. (Both
// once printed errors with %+v: a stack dump per wrapping.)
func TestFailureIsOneLine(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	for _, c := range []struct {
		name, env, value, prefix string
	}{
		{"producer without a temporary directory", "TMPDIR", missing, "ipc: "},
		{"consumer with no producer", consumerEnv, filepath.Join(missing, "producer.sock"), "ipc consumer: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(c.env, c.value)
			var stdout, stderr bytes.Buffer
			require.Equal(t, 1, realMain(nil, &stdout, &stderr))
			msg := stderr.String()
			require.True(t, strings.HasPrefix(msg, c.prefix), msg)
			require.Equal(t, 1, strings.Count(msg, "\n"), "one line: %q", msg)
			require.True(t, strings.HasSuffix(msg, "\n"), msg)
			require.NotContains(t, msg, ".go:", "no stack")
			if runtime.GOOS == "linux" {
				require.Contains(t, msg, "no such file or directory")
			}
		})
	}
}
