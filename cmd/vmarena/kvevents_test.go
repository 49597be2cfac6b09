package main

import (
	"context"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/vmarena/vmarena/kvevents"
)

// TestKVSimulateEvents: a whole kv simulate run publishes its cache's
// events, and they are exact: a subscriber (connected before the run,
// filling what it missed from the replay socket) sees every block stored
// once while held, removed only while held, and cleared at the end, so
// that what it holds then is nothing — as the cache. Each payload is a
// batch of three, each event tagged first.
func TestKVSimulateEvents(t *testing.T) {
	var (
		mu        sync.Mutex
		live      = map[int64][]byte{}
		malformed int
		payloads  [][]byte
		wg        sync.WaitGroup
		sub       = zmq4.NewSub(context.Background())
	)
	saved := kvEventsHook
	defer func() { kvEventsHook = saved }()
	kvEventsHook.started = func(p *kvevents.Publisher) {
		// Subscribe before the run publishes anything.
		require.NoError(t, sub.Dial("tcp://"+p.Addr().String()))
		require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, "kv"))
		for p.Stats().Subscribers == 0 {
			time.Sleep(time.Millisecond)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m, err := sub.Recv()
				if err != nil {
					return // closed
				}
				mu.Lock()
				if len(m.Frames) != 3 || string(m.Frames[0]) != "kv" || len(m.Frames[1]) != 8 {
					malformed++
				} else {
					live[int64(binary.BigEndian.Uint64(m.Frames[1]))] = m.Frames[2]
				}
				mu.Unlock()
			}
		}()
	}
	kvEventsHook.linger = func(p *kvevents.Publisher, _ time.Duration) {
		// The run is over, the cache closed: take every batch from the
		// replay socket, and compare those the PUB socket delivered.
		d := zmq4.NewDealer(context.Background())
		defer d.Close()
		require.NoError(t, d.Dial("tcp://"+p.ReplayAddr().String()))
		var req [8]byte
		require.NoError(t, d.SendMulti(zmq4.NewMsgFrom(nil, req[:])))
		for {
			m, err := d.Recv()
			require.NoError(t, err)
			require.Len(t, m.Frames, 3)
			seq := int64(binary.BigEndian.Uint64(m.Frames[1]))
			if seq == kvevents.EndSeq {
				break
			}
			require.Equal(t, int64(len(payloads)), seq, "replay sends every batch, in order")
			payloads = append(payloads, m.Frames[2])
		}
		require.Equal(t, p.Stats().Batches, len(payloads))
		// Every batch comes live too (the subscription was in first,
		// and nothing is dropped below the mark).
		for {
			mu.Lock()
			n := len(live)
			mu.Unlock()
			if n+malformed == len(payloads) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		mu.Lock()
		for seq, b := range live {
			require.Equal(t, payloads[seq], b, "batch %d live and replayed", seq)
		}
		mu.Unlock()
	}
	code, out, errOut := runKV(t, "simulate", "--trace", filepath.Join(requestsDir, "mooncake_synthetic_trace.jsonl"), "--model", "llama3-8b",
		"--memory", "2GiB", "--limit", "100", "--kv-events", "tcp://127.0.0.1:0", "--kv-events-replay", "tcp://127.0.0.1:0", "--kv-events-topic", "kv",
		"--kv-events-layout", "array")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "cached blocks evicted")
	// The publisher closed first: zmq4's reader may have closed the
	// connection already, and its Close then reports that.
	if err := sub.Close(); err != nil {
		require.ErrorIs(t, err, net.ErrClosed)
	}
	wg.Wait()
	require.Zero(t, malformed, "messages not of topic, sequence number, payload")
	require.Regexp(t, `^vmarena kv simulate: publishing KV events on tcp://127\.0\.0\.1:\d+, replay requests on tcp://127\.0\.0\.1:\d+\n`, errOut)
	require.Regexp(t, `KV events: \d+ batches, \d+ events, .* published; 0 dropped`, errOut)

	held := map[uint64]bool{}
	stored, removed, cleared := 0, 0, 0
	for i, p := range payloads {
		var batch []any
		require.NoError(t, msgpack.Unmarshal(p, &batch), "batch %d", i)
		require.Len(t, batch, 3, "batch %d: ts, events, data_parallel_rank", i)
		require.IsType(t, float64(0), batch[0])
		require.EqualValues(t, 0, batch[2], "rank 0, as vLLM's publisher")
		for _, e := range batch[1].([]any) {
			ev := e.([]any)
			switch ev[0] {
			case "BlockStored":
				require.Len(t, ev, 11)
				for _, h := range ev[1].([]any) {
					k := toUint(t, h)
					require.False(t, held[k], "batch %d stores block %d, held already", i, k)
					held[k] = true
					stored++
				}
			case "BlockRemoved":
				require.Len(t, ev, 4)
				for _, h := range ev[1].([]any) {
					k := toUint(t, h)
					require.True(t, held[k], "batch %d removes block %d, not held", i, k)
					delete(held, k)
					removed++
				}
			case "AllBlocksCleared":
				require.Len(t, ev, 1)
				clear(held)
				cleared++
			default:
				t.Fatalf("batch %d: event %v", i, ev[0])
			}
		}
	}
	require.Positive(t, stored)
	require.Positive(t, removed, "the budget evicts")
	require.Equal(t, 1, cleared, "one AllBlocksCleared, at Close")
	require.Empty(t, held)
	t.Logf("%d batches: %d blocks stored, %d removed, the rest cleared at the end; %d taken live", len(payloads), stored, removed, len(live))
}

func toUint(t *testing.T, v any) uint64 {
	t.Helper()
	switch v := v.(type) {
	case uint64:
		return v
	case int64:
		return uint64(v)
	case uint8:
		return uint64(v)
	case uint16:
		return uint64(v)
	case uint32:
		return uint64(v)
	case int8:
		return uint64(v)
	}
	t.Fatalf("a hash of type %T", v)
	return 0
}

// TestKVSimulateEventsPortInUse: an endpoint that cannot be listened on
// fails the run before it simulates, saying which.
func TestKVSimulateEventsPortInUse(t *testing.T) {
	p, err := kvevents.New(kvevents.Options{Endpoint: "tcp://127.0.0.1:0"})
	require.NoError(t, err)
	defer p.Close()
	ep := "tcp://" + p.Addr().String()
	code, out, errOut := runKV(t, "simulate", "--trace", filepath.Join(requestsDir, "AzureLLMInferenceTrace_conv.csv"), "--model", "llama3-8b",
		"--limit", "5", "--kv-events", ep)
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "vmarena kv simulate: --kv-events: kvevents: listen on "+ep+": ")
	require.Contains(t, errOut, "address already in use")
}

// TestKVSimulateEventsIPCAndVLLMHashes: a run publishing on an ipc://
// endpoint, offset by its data-parallel rank, under vLLM's block hashes,
// says so and leaves no block out.
func TestKVSimulateEventsIPCAndVLLMHashes(t *testing.T) {
	dir, err := os.MkdirTemp("/tmp", "kvsim")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	code, _, errOut := runKV(t, "simulate", "--trace", filepath.Join(requestsDir, "mooncake_synthetic_trace.jsonl"), "--model", "llama3-8b",
		"--memory", "2GiB", "--limit", "30", "--kv-events", "ipc://"+dir+"/kv", "--kv-events-dp-rank", "3", "--kv-events-vllm-hash-seed", "0", "--kv-events-linger", "0s")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "publishing KV events on ipc://"+dir+"/kv_dp3\n")
	require.Regexp(t, `KV events: [1-9]\d* blocks stored under vLLM's hashes, \d+ merged into a vLLM block stored already, 0 left out`, errOut)
	require.NoFileExists(t, dir+"/kv_dp3", "the socket file is removed at the end")
}
