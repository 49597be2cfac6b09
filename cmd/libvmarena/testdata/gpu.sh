#!/bin/bash
# gpu.sh runs libvmarena's and the cuda driver's GPU checks on a machine
# that has a GPU but no Go toolchain: build them here, carry the folder,
# run them there.
#
#   bash cmd/libvmarena/testdata/gpu.sh build gpurun.test   # here, from the repository root
#   bash gpurun.test/gpu.sh run                             # there (the folder travels whole)
#
# A folder named *.test is ignored by the repository's .gitignore, so it
# can be carried as a build output. "run" prints each check's output and
# "ok" lines; any FAIL line is a failure.
set -u
case "${1:-}" in
build)
	out=${2:?usage: gpu.sh build DIR}
	set -e
	mkdir -p "$out"
	go build -buildmode=c-shared -o "$out/libvmarena.so" ./cmd/libvmarena
	for p in gpucycles cycles; do
		gcc -O2 -pthread -I cmd/libvmarena -o "$out/$p" "cmd/libvmarena/testdata/$p.c" \
			-L "$out" -lvmarena -Wl,-rpath,'$ORIGIN' -ldl
	done
	CGO_ENABLED=0 go test -c -o "$out/cuda.test" ./driver/cuda
	cp "$0" "$out/gpu.sh"
	;;
run)
	cd "$(dirname "$0")"
	nvidia-smi -L 2>&1 | head -4
	export VMARENA_DRIVER=cuda
	echo "== gpucycles: 200 cycles of 64 MiB, the caller's context, a free on a busy stream"
	timeout 300 ./gpucycles 200 64
	echo "== vmarena_alloc + vmarena_free of 1 MiB from C, cached (the free waits for stream 0)"
	timeout 60 ./cycles bench 100000
	echo "== driver/cuda on the GPU"
	timeout 200 ./cuda.test -test.run Hardware -test.v 2>&1 | tail -30
	;;
*)
	echo "usage: gpu.sh build DIR | gpu.sh run" >&2
	exit 2
	;;
esac
