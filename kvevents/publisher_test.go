package kvevents

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/kvcache"
)

// TestBadOptions: endpoints that are neither tcp://HOST:PORT nor
// ipc://PATH, and options out
// of range, are errors marked driver.ErrInvalid that name the endpoint;
// nothing is left listening.
func TestBadOptions(t *testing.T) {
	for _, ep := range []string{"", "127.0.0.1:5557", "udp://127.0.0.1:5557", "inproc://x", "ipc://", "ipc://@", "ipc:///tmp/a\x00b",
		"ipc:///" + strings.Repeat("x", maxIPCPath), "tcp://127.0.0.1", "tcp://127.0.0.1:65536",
		"tcp://127.0.0.1:-1", "tcp://127.0.0.1:0x10", "tcp://:5557", "tcp://[::1:5557", "tcp://a/b:5557", "tcp://127.0.0.1:5557/x"} {
		_, err := New(Options{Endpoint: ep})
		require.ErrorIs(t, err, driver.ErrInvalid, "endpoint %q", ep)
		require.Contains(t, err.Error(), "want tcp://HOST:PORT")
		q, err := New(Options{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: ep})
		if ep != "" {
			require.ErrorIs(t, err, driver.ErrInvalid, "replay endpoint %q", ep)
		} else {
			require.NoError(t, err) // no replay socket
			require.Nil(t, q.ReplayAddr())
			require.NoError(t, q.Close())
		}
	}
	minus := -1
	for _, o := range []Options{{Layout: 7}, {BufferSteps: -1}, {BufferBytes: -1}, {HWM: -1}, {Rank: &minus}} {
		o.Endpoint = "tcp://127.0.0.1:0"
		_, err := New(o)
		require.ErrorIs(t, err, driver.ErrInvalid)
	}
	// A port in use is an error, and the replay socket is not left open.
	p := newPublisher(t, Options{})
	defer p.Close()
	_, err := New(Options{Endpoint: "tcp://" + p.Addr().String()})
	require.Error(t, err)
	_, err = New(Options{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://" + p.Addr().String()})
	require.Error(t, err)
}

// TestCloseTwice: the second Close is ErrClosed; Publish after Close does
// nothing.
func TestCloseTwice(t *testing.T) {
	p := newPublisher(t, Options{})
	p.Publish(makeBatch(0, 0))
	require.NoError(t, p.Close())
	require.ErrorIs(t, p.Close(), driver.ErrClosed)
	p.Publish(makeBatch(1, 0))
	require.Equal(t, 1, p.Stats().Batches)
}

// TestEncodeErrorTakesNoNumber: a batch that cannot be encoded is
// counted and takes no sequence number.
func TestEncodeErrorTakesNoNumber(t *testing.T) {
	p := newPublisher(t, Options{})
	defer p.Close()
	p.Publish(kvcache.EventBatch{Events: []kvcache.Event{nil}})
	p.Publish(makeBatch(0, 0))
	s := p.Stats()
	require.Equal(t, 1, s.EncodeErrors)
	require.Equal(t, 1, s.Batches)
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Equal(t, []int64{0}, seqsOf(p.fromLocked(0)))
}

// fromLocked is the kept batches from sequence number start on, as
// replay sends them (keptLocked, one after another).
func (p *Publisher) fromLocked(start int64) []kept {
	var out []kept
	for {
		k, ok := p.keptLocked(start)
		if !ok {
			return out
		}
		out = append(out, k)
		start = k.seq + 1
	}
}

func seqsOf(ks []kept) []int64 {
	out := make([]int64, len(ks))
	for i, k := range ks {
		out[i] = k.seq
	}
	return out
}

// TestReplayBufferModel: random publishes of random sizes and replays
// from random numbers, against a reference model (a plain list of every
// batch, the kept ones its newest that fit both bounds), compared each
// step.
func TestReplayBufferModel(t *testing.T) {
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 1))
		steps, bytesCap := 1+rng.IntN(40), 200+rng.IntN(4000)
		p := newPublisher(t, Options{BufferSteps: steps, BufferBytes: bytesCap})
		type rec struct {
			seq  int64
			size int
		}
		var all []rec
		for i := range 600 {
			if rng.IntN(4) > 0 {
				tokens := rng.IntN(64)
				b := kvcache.EventBatch{TS: time.Unix(int64(i), 0)}
				if tokens > 0 {
					b = makeBatch(i, tokens)
				}
				p.Publish(b)
				payload, err := EncodeBatch(b, nil, Array)
				require.NoError(t, err)
				all = append(all, rec{int64(len(all)), len(payload)})
			}
			// The model: the newest that fit both bounds, none bigger
			// than the whole buffer (those are skipped, and end the run).
			var keep []int64
			used := 0
			for j := len(all) - 1; j >= 0; j-- {
				if all[j].size > bytesCap {
					break
				}
				if len(keep) == steps || used+all[j].size > bytesCap {
					break
				}
				used += all[j].size
				keep = append([]int64{all[j].seq}, keep...)
			}
			start := int64(rng.IntN(len(all) + 2))
			var want []int64
			for _, s := range keep {
				if s >= start {
					want = append(want, s)
				}
			}
			p.mu.Lock()
			got := seqsOf(p.fromLocked(start))
			n, used2 := p.n, p.bytes
			p.mu.Unlock()
			if len(want) == 0 {
				want = []int64{}
			}
			require.Equal(t, want, got, "seed %d step %d from %d", seed, i, start)
			require.Equal(t, len(keep), n)
			require.Equal(t, used, used2)
		}
		require.NoError(t, p.Close())
	}
}

// FuzzParseReplayRequest: any frames are parsed without a panic; what is
// accepted is the shape asked for, and a number of 0 or more.
func FuzzParseReplayRequest(f *testing.F) {
	f.Add([]byte{0, 8, 0, 0, 0, 0, 0, 0, 0, 5})
	f.Add([]byte{0, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{1, 'x', 8, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		// data is frames, each a length byte and that many bytes.
		var frames [][]byte
		for len(data) > 0 {
			n := min(int(data[0]), len(data)-1)
			frames = append(frames, data[1:1+n])
			data = data[1+n:]
		}
		seq, err := ParseReplayRequest(frames)
		if err != nil {
			require.ErrorIs(t, err, driver.ErrInvalid)
			return
		}
		require.Len(t, frames, 2)
		require.Empty(t, frames[0])
		require.Len(t, frames[1], 8)
		require.GreaterOrEqual(t, seq, int64(0))
		require.Equal(t, uint64(seq), binary.BigEndian.Uint64(frames[1]))
	})
}

// FuzzOffsetEndpoint: any endpoint and rank give an endpoint or an error
// marked driver.ErrInvalid, never a panic, and an endpoint given back
// parses to itself at rank 0.
func FuzzOffsetEndpoint(f *testing.F) {
	for _, ep := range []string{"tcp://*:5557", "tcp://127.0.0.1:0", "tcp://[::1]:65535", "ipc:///tmp/kv", "ipc://@kv", "inproc://x", "tcp://a:b:c", ""} {
		f.Add(ep, 0)
		f.Add(ep, 3)
	}
	f.Fuzz(func(t *testing.T, ep string, rank int) {
		got, err := OffsetEndpoint(ep, rank)
		if err != nil {
			require.ErrorIs(t, err, driver.ErrInvalid)
			return
		}
		again, err := OffsetEndpoint(got, 0)
		require.NoError(t, err, "%q from %q rank %d", got, ep, rank)
		require.Equal(t, got, again)
	})
}
