package disagg

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/internal/transformer"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/transfer"
	"github.com/vmarena/vmarena/vaspace"
)

// prefillEnv, when set (to "KIND LAYOUT"), makes the test binary the
// prefill process of TestTwoProcesses instead of running tests: it serves
// its side over stdin and stdout, one JSON request and one JSON reply a
// line (wire, below), and the bytes through a transfer engine of KIND.
const prefillEnv = "VMARENA_DISAGG_PREFILL"

func TestMain(m *testing.M) {
	if v := os.Getenv(prefillEnv); v != "" {
		if err := servePrefill(v, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "prefill process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// wire is one request to the prefill process, or its reply. Requests:
// {"Op":"prefill","Prompt":[...]} → Handoff; {"Op":"units","ID":..,"From":..,
// "To":..} → Refs; {"Op":"release","ID":..}; {"Op":"quit"}. A reply with
// Err set is a refusal (Sentinel names its driver sentinel).
type wire struct {
	Op       string
	Prompt   []int   `json:",omitempty"`
	ID       uint64  `json:",omitempty"`
	From, To int     `json:",omitempty"`
	Handoff  Handoff `json:",omitzero"`
	Refs     [][]Ref `json:",omitempty"`
	Addr     string  `json:",omitempty"`
	Err      string  `json:",omitempty"`
	Sentinel string  `json:",omitempty"`
}

// servePrefill is the prefill process: its own host driver, cache (as
// newSides makes the prefill side's) and model, a transfer engine whose
// address it says first, and the requests of the decode process.
func servePrefill(v string, in io.Reader, out io.Writer) (err error) {
	var kind, layoutName string
	if _, err := fmt.Sscan(v, &kind, &layoutName); err != nil {
		return errors.Wrapf(err, "%s=%q", prefillEnv, v)
	}
	layout := kvcache.TokenMajor
	if layoutName == kvcache.PerLayer.String() {
		layout = kvcache.PerLayer
	}
	drv, err := host.New(host.Options{Devices: 1, Capacity: 64 * units.MiB, Granularity: page})
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	m, err := transformer.New(modelConfig, 5)
	if err != nil {
		return err
	}
	cache, err := kvcache.New(vaspace.New(drv), physical.New(drv), kvcache.Config{Layers: modelConfig.Layers,
		KVHeads: modelConfig.KVHeads, HeadDim: modelConfig.HeadDim, DType: tensor.Float32,
		BlockTokens: unitTokensOf(layout), MaxContext: 256, MaxSeqs: 4, PageSize: page, Layout: layout, MapAhead: -1})
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, cache.Close()) }()
	e, err := transfer.New(transfer.Config{Kind: kind})
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, e.Close()) }()
	p, err := NewPrefill(cache, m, EngineExporter(e))
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, p.Close()) }()
	enc, dec := json.NewEncoder(out), json.NewDecoder(in)
	if err := enc.Encode(wire{Addr: e.Addr()}); err != nil {
		return err
	}
	ctx := context.Background()
	for {
		var req wire
		if err := dec.Decode(&req); err != nil {
			return errors.Wrap(err, "reading a request")
		}
		var rep wire
		var rerr error
		switch req.Op {
		case "prefill":
			rep.Handoff, rerr = p.Prefill(req.Prompt, 0)
		case "units":
			rep.Refs, rerr = p.Units(ctx, req.ID, req.From, req.To)
		case "release":
			rerr = p.Release(ctx, req.ID)
		case "quit":
			return nil
		default:
			rerr = errors.Wrapf(driver.ErrInvalid, "unknown op %q", req.Op)
		}
		if rerr != nil {
			rep.Err = rerr.Error()
			for _, s := range []error{driver.ErrInvalid, driver.ErrClosed} {
				if errors.Is(rerr, s) {
					rep.Sentinel = s.Error()
				}
			}
		}
		if err := enc.Encode(rep); err != nil {
			return err
		}
	}
}

// remotePrefill is the prefill process as the decode process reaches it:
// a Source over its stdin and stdout.
type remotePrefill struct {
	mu   sync.Mutex
	cmd  *exec.Cmd
	enc  *json.Encoder
	dec  *json.Decoder
	addr string
}

func startPrefill(t *testing.T, kind string, layout kvcache.Layout) *remotePrefill {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), prefillEnv+"="+kind+" "+layout.String())
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	r := &remotePrefill{cmd: cmd, enc: json.NewEncoder(stdin), dec: json.NewDecoder(bufio.NewReader(stdout))}
	t.Cleanup(func() {
		_ = stdin.Close() // a process still reading stops at EOF
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		<-done
	})
	var hello wire
	require.NoError(t, r.dec.Decode(&hello))
	require.NotEmpty(t, hello.Addr)
	r.addr = hello.Addr
	return r
}

func (r *remotePrefill) call(req wire) (wire, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.enc.Encode(req); err != nil {
		return wire{}, err
	}
	var rep wire
	if err := r.dec.Decode(&rep); err != nil {
		return wire{}, err
	}
	if rep.Err != "" {
		err := errors.New(rep.Err)
		for _, s := range []error{driver.ErrInvalid, driver.ErrClosed} {
			if rep.Sentinel == s.Error() {
				err = sentinel.Mark(err, s)
			}
		}
		return rep, err
	}
	return rep, nil
}

func (r *remotePrefill) prefill(prompt []int) (Handoff, error) {
	rep, err := r.call(wire{Op: "prefill", Prompt: prompt})
	return rep.Handoff, err
}

func (r *remotePrefill) Units(_ context.Context, id uint64, from, to int) ([][]Ref, error) {
	rep, err := r.call(wire{Op: "units", ID: id, From: from, To: to})
	return rep.Refs, err
}

func (r *remotePrefill) Release(_ context.Context, id uint64) error {
	_, err := r.call(wire{Op: "release", ID: id})
	return err
}

// TestTwoProcesses is disaggregation between two processes: a prefill
// process (this test binary run again) computes prompts into its own KV
// cache and exports their units through a transfer engine; this process,
// the decode side, fetches the units its prefix store lacks through its
// own engine and decodes. The tokens and logits are those of one process
// doing both, the units it holds are not fetched again, and the engines
// moved exactly the bytes the decode side counted. Both kinds of engine,
// both layouts.
func TestTwoProcesses(t *testing.T) {
	for _, kind := range []string{"tcp", "ucx"} {
		for _, layout := range []kvcache.Layout{kvcache.PerLayer, kvcache.TokenMajor} {
			t.Run(kind+"/"+layout.String(), func(t *testing.T) {
				if !slices.Contains(transfer.Kinds(), kind) {
					t.Skip("this build has no UCX (build with -tags ucx, cgo and libucx-dev)")
				}
				twoProcesses(t, kind, layout)
			})
		}
	}
}

func twoProcesses(t *testing.T, kind string, layout kvcache.Layout) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pp := startPrefill(t, kind, layout)
	s := newSides(t, layout, 256, 4) // the decode side is s.dc; s.prefill is not used
	de, err := transfer.New(transfer.Config{Kind: kind})
	require.NoError(t, err)
	defer func() { require.NoError(t, de.Close()) }()
	peer, err := de.Connect(ctx, pp.addr)
	require.NoError(t, err)
	decode, err := NewDecode(s.dc, s.model, EngineFetcher(de, peer))
	require.NoError(t, err)

	rng := rand.New(rand.NewPCG(7, uint64(layout)))
	tpu := unitTokensOf(layout)
	base := randomTokens(rng, 2*tpu+6)
	prompts := [][]int{base, append(slices.Clone(base[:2*tpu]), randomTokens(rng, 5)...), base, randomTokens(rng, tpu+3)}
	var total uint64
	for i, p := range prompts {
		cached := s.index.cached(p)
		h, err := pp.prefill(p)
		require.NoError(t, err)
		res, err := decode.Decode(ctx, pp, h, 4)
		require.NoError(t, err)
		want, wantLogits := reference(t, s.model, p, 4)
		require.Equal(t, want, res.Tokens, "prompt %d", i)
		require.Equal(t, wantLogits, res.Logits, "prompt %d", i)
		require.Equal(t, cached, res.Cached, "prompt %d: units its prefix store held", i)
		require.Equal(t, uint64(h.Units-res.Cached)*unitBytesOf(layout), res.Bytes, "prompt %d: the units it lacked, no more", i)
		if i == 2 {
			require.Positive(t, res.Cached, "the third prompt repeats the first: its whole units are cached")
		}
		total += res.Bytes
	}
	require.Equal(t, total, de.Stats().BytesIn, "the engine moved the bytes the decode side counted")

	// A request the prefill process let go is refused, from the other
	// process, and nothing is fetched.
	h, err := pp.prefill(prompts[3])
	require.NoError(t, err)
	require.NoError(t, pp.Release(ctx, h.ID))
	before := de.Stats()
	_, err = decode.Decode(ctx, pp, h, 4)
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.Equal(t, before.BytesIn, de.Stats().BytesIn)

	require.NoError(t, peer.Close())
	require.NoError(t, s.dc.Check())
	_, err = pp.call(wire{Op: "quit"})
	require.ErrorIs(t, err, io.EOF)
}
