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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/cuda/cudatest"
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

// prefillEnv, when set (to "KIND LAYOUT" or "KIND LAYOUT STANDIN"), makes
// the test binary the prefill process of TestTwoProcesses (and
// TestDeviceTwoProcesses) instead of running tests: it serves its side
// over stdin and stdout, one JSON request and one JSON reply a line (wire,
// below), and the bytes through a transfer engine of KIND. With STANDIN,
// the path of a CUDA stand-in library, its cache is on device 0 of its own
// instance of the stand-in (another process's GPU) and its engine stages
// through a pinned buffer there.
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
	f := strings.Fields(v)
	if len(f) != 2 && len(f) != 3 {
		return errors.Newf("%s=%q: want KIND LAYOUT [STANDIN]", prefillEnv, v)
	}
	kind, layout := f[0], kvcache.TokenMajor
	if f[1] == kvcache.PerLayer.String() {
		layout = kvcache.PerLayer
	}
	var drv driver.Driver
	var staging transfer.Staging
	if len(f) == 3 {
		d, lib, err := cudatest.OpenFile(f[2], deviceMachine(1).Standin(), cuda.Options{})
		if err != nil {
			return err
		}
		defer func() {
			err = errors.CombineErrors(err, d.Close())
			if leaks := lib.Leaks(); err == nil && len(leaks) > 0 {
				err = errors.Newf("the stand-in still holds %s", strings.Join(leaks, ", "))
			}
		}()
		drv, staging = d, deviceStaging(d, 0)
	} else {
		d, err := host.New(host.Options{Devices: 1, Capacity: 64 * units.MiB, Granularity: page})
		if err != nil {
			return err
		}
		defer func() { err = errors.CombineErrors(err, d.Close()) }()
		drv = d
	}
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
	e, err := transfer.New(transfer.Config{Kind: kind, Staging: staging})
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
	mu      sync.Mutex
	cmd     *exec.Cmd
	enc     *json.Encoder
	dec     *json.Decoder
	addr    string
	waited  sync.Once
	waitErr error
}

// wait waits for the process to end and returns its exit (nil for 0).
func (r *remotePrefill) wait() error {
	r.waited.Do(func() { r.waitErr = r.cmd.Wait() })
	return r.waitErr
}

// startPrefill starts the prefill process; standin, if not empty, is the
// CUDA stand-in library it opens its own instance of.
func startPrefill(t *testing.T, kind string, layout kvcache.Layout, standin string) *remotePrefill {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), strings.TrimSpace(prefillEnv+"="+kind+" "+layout.String()+" "+standin))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	r := &remotePrefill{cmd: cmd, enc: json.NewEncoder(stdin), dec: json.NewDecoder(bufio.NewReader(stdout))}
	t.Cleanup(func() {
		_ = stdin.Close() // a process still reading stops at EOF
		_ = r.wait()
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
				twoProcesses(t, kind, layout, nil, "")
			})
		}
	}
}

// TestDeviceTwoProcesses is TestTwoProcesses with device memory on both
// sides: the prefill process's cache on device 0 of its own instance of
// the CUDA stand-in (another process's GPU: the instances share nothing),
// this process's decode cache on device 1 of its own, and the units moved
// over the tcp kind between two engines that each stage through a pinned
// buffer on their cache's device. The prefill process exits 0 only if its
// stand-in holds nothing once it closes.
func TestDeviceTwoProcesses(t *testing.T) {
	for _, layout := range []kvcache.Layout{kvcache.PerLayer, kvcache.TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			drv, lib := cudatest.Open(t, deviceMachine(2).Standin(), cuda.Options{})
			twoProcesses(t, "tcp", layout, drv, lib.Path())
		})
	}
}

// twoProcesses runs the prefill process and decodes here: on the host
// driver (drv nil), or on device 1 of drv with the prefill process on its
// own instance of the CUDA stand-in at standin.
func twoProcesses(t *testing.T, kind string, layout kvcache.Layout, drv driver.Driver, standin string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pp := startPrefill(t, kind, layout, standin)
	var s *sides // the decode side is s.dc; s.prefill is not used
	cfg := transfer.Config{Kind: kind}
	if drv == nil {
		s = newSides(t, layout, 256, 4)
	} else {
		s = newSidesOn(t, drv, layout, 256, 4)
		cfg.Staging = deviceStaging(drv, 1)
	}
	de, err := transfer.New(cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, de.Close()) }()
	peer, err := de.Connect(ctx, pp.addr)
	require.NoError(t, err)
	decode, err := NewDecode(s.dc, s.model, EngineFetcher(de, peer))
	require.NoError(t, err)

	prompts := sharingPrompts(rand.New(rand.NewPCG(7, uint64(layout))), layout)
	total := s.decodeAll(t, layout, prompts, pp.prefill, pp, decode)
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
	require.NoError(t, pp.wait(), "the prefill process closed everything")
	require.NoError(t, s.prefill.Close())
	for _, c := range []*kvcache.Cache{s.pc, s.dc} {
		require.NoError(t, c.Close())
	}
}
