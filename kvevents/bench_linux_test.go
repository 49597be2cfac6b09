package kvevents

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/kvcache"
)

func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}

// BenchmarkPublish times what the cache's callback costs its caller: a
// batch of one BlockStored of 16 blocks of 16 tokens (a 256-token prompt
// published by one MarkWritten) through Publish (encode, keep for
// replay; no subscriber connected, whose writer runs on a goroutine of
// its own anyway), beside the
// baseline in the same process, kvcache.MarshalEventBatch (the JSON line
// EventWriter writes). It reports wall and thread-CPU nanoseconds a
// batch for both, and the ratio.
func BenchmarkPublish(b *testing.B) {
	batch := makeBatch(1, 0)
	e := &kvcache.BlockStored{BlockSize: 16, Medium: kvcache.EventMedium}
	for i := range 16 {
		e.BlockHashes = append(e.BlockHashes, uint64(i)*0x9e3779b97f4a7c15)
		for j := range 16 {
			e.TokenIDs = append(e.TokenIDs, 1000+i*16+j)
		}
	}
	batch.Events = []kvcache.Event{e}
	p, err := New(Options{Endpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	measure := func(f func()) (wall, cpu time.Duration) {
		w, c := time.Now(), threadCPU()
		for range b.N {
			f()
		}
		return time.Since(w), threadCPU() - c
	}
	b.ResetTimer()
	jw, jc := measure(func() {
		if _, err := kvcache.MarshalEventBatch(batch, nil); err != nil {
			b.Fatal(err)
		}
	})
	pw, pc := measure(func() { p.Publish(batch) })
	n := float64(b.N)
	b.ReportMetric(float64(pw)/n, "publish-wall-ns")
	b.ReportMetric(float64(pc)/n, "publish-cpu-ns")
	b.ReportMetric(float64(jw)/n, "json-wall-ns")
	b.ReportMetric(float64(jc)/n, "json-cpu-ns")
	b.ReportMetric(float64(pc)/float64(jc), "cpu-ratio-publish/json")
}
