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
	cp cmd/libvmarena/testdata/torch_sleep.py "$out/"
	cp "$0" "$out/gpu.sh"
	;;
run)
	# Each check's whole output also goes to $OUT/NAME.log when $OUT is set.
	logs=${OUT:-/tmp}
	cd "$(dirname "$0")"
	nvidia-smi -L 2>&1 | head -4
	export VMARENA_DRIVER=cuda
	echo "== driver/cuda's conformance suite and round trip on the GPU"
	timeout 120 ./cuda.test -test.run Hardware -test.v >"$logs/conformance.log" 2>&1
	echo "exit $?"
	grep -E "^(--- |ok|PASS|FAIL)|^\s+--- FAIL" "$logs/conformance.log" | head -20
	echo "subtests: $(grep -c -- '--- PASS' "$logs/conformance.log") passed, $(grep -c -- '--- SKIP' "$logs/conformance.log") skipped, $(grep -c -- '--- FAIL' "$logs/conformance.log") failed"
	echo "== each virtual-memory call timed on the GPU, beside the A100 prices replay uses"
	timeout 40 ./cuda.test -test.run '^$' -test.bench HardwareCalls -test.benchtime 100x 2>&1 | tee "$logs/calls.log" | grep -E "Benchmark|FAIL|ok"
	echo "== gpucycles: 100 cycles of 64 MiB, the caller's context, a free on a busy stream"
	timeout 60 ./gpucycles 100 64 2>&1 | tee "$logs/gpucycles.log" | tail -8
	echo "== vmarena_alloc + vmarena_free of 1 MiB from C, cached (the free waits for stream 0)"
	timeout 30 ./cycles bench 100000 2>&1 | tail -4
	echo "== PyTorch: CUDAPluggableAllocator + MemPool, sleep and wake under torch, a CUDA graph kept"
	VMARENA_TAG_MAX=16GiB timeout 100 python3 torch_sleep.py ./libvmarena.so 10 2>&1 | tee "$logs/torch.log" | tail -30
	echo "== the same with VMARENA_HOST_CACHE=2GiB (pinned backups kept between cycles)"
	VMARENA_HOST_CACHE=2GiB VMARENA_TAG_MAX=16GiB timeout 100 python3 torch_sleep.py ./libvmarena.so 10 2>&1 | tee "$logs/torch-cache.log" | grep -E "FAIL|1 GiB|freed"
	;;
*)
	echo "usage: gpu.sh build DIR | gpu.sh run" >&2
	exit 2
	;;
esac
