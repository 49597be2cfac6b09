package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/budget"
	"github.com/vmarena/vmarena/budget/kvmember"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// The shared-budget simulation: two serving processes on one device,
// whose loads peak in turn, run in lock step by this process (the
// driver), once with a static half of the device each and once joined to
// one elastic budget. Only one server runs a step at a time and every
// give-back is answered before the asker's step ends, so the figures
// depend on the trace alone, not on the machine's load.

// serverEnv names the book a re-executed vmarena serves on as one of the
// simulation's servers.
const serverEnv = "VMARENA_BUDGET_SERVER"

// simConfig is one simulation.
type simConfig struct {
	Seed       uint64  `json:"seed"`
	Steps      int     `json:"steps"`
	Phase      int     `json:"phase_steps"`      // steps between the peaks' turns
	Pages      int     `json:"capacity_pages"`   // the device, in KV pages
	PageBytes  uint64  `json:"page_bytes"`       // one page
	TTFTBound  int     `json:"ttft_bound_steps"` // a request not started within it is not served
	StepMillis int     `json:"step_ms"`          // a step's simulated time
	HighRate   float64 `json:"high_rate"`
	LowRate    float64 `json:"low_rate"`
	Floor      int     `json:"floor_pages"` // the elastic budget's floor of each server
	Floors     []int   `json:"floors_pages"`
	// Kinds is each server's cache: simCache (kvcache.Cache) or
	// simHybrid (kvcache.Hybrid).
	Kinds []string `json:"kinds"`
}

// The servers' kinds of cache (simConfig.Kinds, --kinds).
const (
	simCache  = "cache"  // kvcache.Cache of the tiny preset
	simHybrid = "hybrid" // kvcache.Hybrid: the tiny preset's layers and two recurrent ones
)

func defaultSim() simConfig {
	return simConfig{Seed: 1, Steps: 800, Phase: 100, Pages: 128, PageBytes: 2 << 20, TTFTBound: 10, StepMillis: 50,
		HighRate: 0.7, LowRate: 0.05, Floor: 0, Floors: []int{0, 8, 16}, Kinds: []string{simCache, simCache}}
}

// simRequest is one request of a server's trace.
type simRequest struct {
	Arrive, Pages, Steps int
}

// pooledServer is the k of the one server that serves both traces on the
// whole device (simulateBoth's bound).
const pooledServer = -1

// trace generates server k's requests: Poisson arrivals at HighRate in
// its peaks and LowRate between, the peaks of the two servers
// alternating; for pooledServer, both servers' requests in the order
// they arrive.
func (c simConfig) trace(k int) []simRequest {
	if k == pooledServer {
		both := append(c.trace(0), c.trace(1)...)
		slices.SortStableFunc(both, func(a, b simRequest) int { return a.Arrive - b.Arrive })
		return both
	}
	rng := rand.New(rand.NewPCG(c.Seed, uint64(k)+1))
	var out []simRequest
	for t := 0; t < c.Steps; t++ {
		rate := c.LowRate
		if (t/c.Phase+k)%2 == 0 {
			rate = c.HighRate
		}
		// Arrivals in a step: Poisson (Knuth's product of uniforms).
		for p, l := rng.Float64(), math.Exp(-rate); p > l; p *= rng.Float64() {
			out = append(out, simRequest{Arrive: t, Pages: 4 + rng.IntN(9), Steps: 10 + rng.IntN(21)})
		}
	}
	return out
}

// serverStats is what one server reports at the end.
type serverStats struct {
	Arrived        int     `json:"arrived"`
	Served         int     `json:"served"`
	Dropped        int     `json:"dropped"`
	MeanTTFTSteps  float64 `json:"mean_ttft_steps"`
	PeakPages      int     `json:"peak_pages"`         // the most the cache committed, pooled pages included
	Asks           int     `json:"asked"`              // requests to give back it answered
	GaveBackPages  int     `json:"gave_back_pages"`    // what it gave back for them
	Grows          int     `json:"grows"`              // admissions that grew the member's hold
	Preemptions    int     `json:"preemptions"`        // the cache's: a give-back never preempts
	MaxAskWallSec  float64 `json:"max_acquire_wall_s"` // the longest admission that grew
	MeanStepWall   float64 `json:"mean_step_wall_s"`
	AsksOverOneStp int     `json:"acquires_over_one_step"` // growing admissions whose wall passed a step's simulated time
}

// simTokensPerPage is the tokens one KV page holds in the servers' caches:
// the tiny preset (16 KiB of KV a token, TokenMajor) on 2 MiB pages.
const simTokensPerPage = 128

// simStateBytes is a layer's recurrent state in the hybrid servers'
// caches: 64 KiB, two layers, 128 KiB a sequence.
const simStateBytes = 64 << 10

// server is one simulated serving process: a kvcache.Cache (or, of kind
// simHybrid, a kvcache.Hybrid) on a sim driver of the device's capacity,
// a member of the book through kvmember.
type server struct {
	cfg   simConfig
	k     int
	drv   *sim.Driver
	mem   *physical.Memory
	c     *kvcache.Cache
	h     *kvcache.Hybrid
	m     *kvmember.Member
	trace []simRequest
	next  int
	queue []int // indexes into trace
	run   []simRunning
	st    serverStats
	ttft  int
	steps time.Duration
}

// simRunning is a running request: its sequence (of the server's kind)
// and the step it ends.
type simRunning struct {
	seq  *kvcache.Seq
	hseq *kvcache.HybridSeq
	end  int
}

func (r simRunning) append(tokens []int) error {
	if r.hseq != nil {
		_, err := r.hseq.Append(tokens)
		return err
	}
	_, err := r.seq.Append(tokens)
	return err
}

func (r simRunning) free() error {
	if r.hseq != nil {
		return r.hseq.Free()
	}
	return r.seq.Free()
}

func (r simRunning) len() int {
	if r.hseq != nil {
		return r.hseq.Len()
	}
	return r.seq.Len()
}

// newServer makes server k's cache, of the kind cfg.Kinds says. A
// request of p pages has a prompt of p-1 pages and half of one, and
// appends a token a step while it runs (at most 30 steps): its p pages
// hold it to the end (and, in a hybrid cache, its recurrent state).
func newServer(cfg simConfig, k int) (*server, error) {
	if cfg.PageBytes != 2<<20 {
		return nil, fmt.Errorf("budget simulate: pages of %d bytes, the servers' caches take 2 MiB", cfg.PageBytes)
	}
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: uint64(cfg.Pages) * cfg.PageBytes, Granularity: cfg.PageBytes})
	if err != nil {
		return nil, err
	}
	kc, err := kvcache.Preset("tiny")
	if err != nil {
		return nil, errors.CombineErrors(err, drv.Close())
	}
	kc.Layout, kc.PageSize, kc.MapAhead = kvcache.TokenMajor, cfg.PageBytes, -1
	kc.MaxContext, kc.MaxSeqs = 12*simTokensPerPage, cfg.Pages/4+1
	if k == pooledServer {
		kc.MaxSeqs *= 2 // both servers' slots
	}
	mem := physical.New(drv)
	s := &server{cfg: cfg, k: k, drv: drv, mem: mem, trace: cfg.trace(k)}
	switch kind := cfg.kind(k); kind {
	case simCache:
		s.c, err = kvcache.New(vaspace.New(drv), mem, kc)
	case simHybrid:
		// The tiny preset's layers as a full-attention group (the same
		// 128 tokens a page) and two recurrent layers: a request's pages
		// hold it as a Cache's do, and its state takes 128 KiB more.
		s.h, err = kvcache.NewHybrid(vaspace.New(drv), mem, kvcache.HybridConfig{Groups: []kvcache.Group{
			{Kind: kvcache.FullAttention, Layers: kc.Layers, KVHeads: kc.KVHeads, HeadDim: kc.HeadDim},
			{Kind: kvcache.Recurrent, Layers: 2, StateBytes: simStateBytes},
		}, DType: kc.DType, MaxContext: kc.MaxContext, MaxSeqs: kc.MaxSeqs, PageSize: cfg.PageBytes, MapAhead: -1})
	default:
		err = fmt.Errorf("budget simulate: server %d: a cache of kind %q, want %s or %s", k, kind, simCache, simHybrid)
	}
	if err != nil {
		return nil, errors.CombineErrors(err, drv.Close())
	}
	return s, nil
}

// kind is server k's kind of cache (simCache where Kinds does not say;
// pooledServer's is the first server's).
func (c simConfig) kind(k int) string {
	k = max(k, 0)
	if k < len(c.Kinds) {
		return c.Kinds[k]
	}
	return simCache
}

// join makes the server a member of b.
func (s *server) join(b *budget.Book, floor, ceiling uint64) error {
	name := fmt.Sprintf("server-%d", s.k)
	if s.k == pooledServer {
		name = "server-both"
	}
	var err error
	if s.h != nil {
		s.m, err = kvmember.JoinHybrid(b, name, floor, ceiling, s.h)
	} else {
		s.m, err = kvmember.Join(b, name, floor, ceiling, s.c)
	}
	return err
}

// admit admits request i's prompt through the member, growing its hold
// as it must.
func (s *server) admit(prompt []int, steps int) (simRunning, error) {
	if s.h != nil {
		q, err := s.m.AdmitHybrid(prompt, steps)
		return simRunning{hseq: q}, err
	}
	q, err := s.m.Admit(prompt, 0, steps)
	return simRunning{seq: q}, err
}

// preemptions is the cache's preemptions.
func (s *server) preemptions() int {
	if s.h != nil {
		return s.h.Stats().Preemptions
	}
	return s.c.Stats().Preemptions
}

// prompt is request i's tokens: none another request has, so that no
// prefix is shared and each takes the pages the trace says.
func (s *server) prompt(i int) []int {
	r := s.trace[i]
	out := make([]int, (r.Pages-1)*simTokensPerPage+simTokensPerPage/2)
	base := ((s.k+1)*len(s.trace) + i) << 16 // pooledServer's from 0
	for j := range out {
		out[j] = base + j
	}
	return out
}

// step runs step t.
func (s *server) step(t int) error {
	start := time.Now()
	// Running requests decode a token; finished ones leave their pages
	// cached (the prefix store) and idle (their slots).
	for i := 0; i < len(s.run); {
		if r := s.run[i]; r.end <= t {
			if err := r.free(); err != nil {
				return err
			}
			s.run = slices.Delete(s.run, i, i+1)
			continue
		}
		if err := s.run[i].append([]int{1}); err != nil {
			return fmt.Errorf("server %d at step %d: a decode: %w", s.k, t, err)
		}
		i++
	}
	for s.next < len(s.trace) && s.trace[s.next].Arrive <= t {
		s.queue = append(s.queue, s.next)
		s.st.Arrived++
		s.next++
	}
	// Requests past the TTFT bound are not served.
	for len(s.queue) > 0 && t-s.trace[s.queue[0]].Arrive > s.cfg.TTFTBound {
		s.queue = s.queue[1:]
		s.st.Dropped++
	}
	for len(s.queue) > 0 {
		i := s.queue[0]
		r := s.trace[i]
		prompt := s.prompt(i)
		asked := s.m.Stats().Hold
		// Lock step: the other server waits for the driver, so only
		// this admission's asks run its give-back now.
		t0 := time.Now()
		seq, err := s.admit(prompt, r.Steps)
		d := time.Since(t0)
		if s.m.Stats().Hold > asked {
			s.st.Grows++
			s.st.MaxAskWallSec = max(s.st.MaxAskWallSec, d.Seconds())
			if d > time.Duration(s.cfg.StepMillis)*time.Millisecond {
				s.st.AsksOverOneStp++
			}
		}
		if errors.Is(err, driver.ErrOutOfMemory) || errors.Is(err, driver.ErrBusy) {
			break // the head waits for room
		} else if err != nil {
			return err
		}
		if err := seq.append(prompt[seq.len():]); err != nil {
			return fmt.Errorf("server %d at step %d: the prompt of an admitted request: %w", s.k, t, err)
		}
		seq.end = t + r.Steps
		s.queue = s.queue[1:]
		s.run = append(s.run, seq)
		s.st.Served++
		s.ttft += t - r.Arrive
	}
	if err := s.m.Sync(); err != nil {
		return err
	}
	s.st.PeakPages = max(s.st.PeakPages, int(s.used()/s.cfg.PageBytes))
	s.steps += time.Since(start)
	return nil
}

// used is what the server's device has committed (the driver's count).
func (s *server) used() uint64 {
	u, err := s.mem.Usage(0)
	if err != nil {
		return 0
	}
	return u.Used
}

// close frees every sequence, closes the cache, leaves the book and
// closes the driver.
func (s *server) close() error {
	var err error
	for _, r := range s.run {
		err = errors.CombineErrors(err, r.free())
	}
	s.run = nil
	if s.h != nil {
		err = errors.CombineErrors(err, s.h.Close())
	} else {
		err = errors.CombineErrors(err, s.c.Close())
	}
	if s.m != nil {
		err = errors.CombineErrors(err, s.m.Close())
	}
	return errors.CombineErrors(err, s.drv.Close())
}

// serveBudget is a re-executed vmarena's life as one server: it reads its
// configuration and steps from stdin, answers each on stdout with the
// pages its device has committed and the pages it holds, and ends with
// its stats.
func serveBudget(stdin io.Reader, stdout io.Writer) int {
	in := bufio.NewScanner(stdin)
	fail := func(err error) int { fmt.Fprintf(stdout, "error %v\n", err); return 1 }
	if !in.Scan() {
		return fail(fmt.Errorf("no configuration"))
	}
	var hello struct {
		Config        simConfig `json:"config"`
		K             int       `json:"k"`
		Floor, Ceil   int
		Book          string
		GiveBackWaitS float64
	}
	if err := json.Unmarshal(in.Bytes(), &hello); err != nil {
		return fail(err)
	}
	b, err := budget.Open(hello.Book, budget.Options{GiveBackWait: time.Duration(hello.GiveBackWaitS * float64(time.Second))})
	if err != nil {
		return fail(err)
	}
	s, err := newServer(hello.Config, hello.K)
	if err != nil {
		return fail(errors.CombineErrors(err, b.Close()))
	}
	pb := hello.Config.PageBytes
	if err = s.join(b, uint64(hello.Floor)*pb, uint64(hello.Ceil)*pb); err != nil {
		return fail(errors.CombineErrors(err, s.close()))
	}
	fmt.Fprintln(stdout, "ready")
	for in.Scan() {
		line := in.Text()
		if line == "end" {
			break
		}
		t, err := strconv.Atoi(strings.TrimPrefix(line, "step "))
		if err != nil {
			return fail(err)
		}
		if err := s.step(t); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "ok %d %d\n", s.used(), s.m.Stats().Hold)
	}
	if s.st.Served > 0 {
		s.st.MeanTTFTSteps = float64(s.ttft) / float64(s.st.Served)
	}
	if n := hello.Config.Steps; n > 0 {
		s.st.MeanStepWall = s.steps.Seconds() / float64(n)
	}
	st := s.st
	ms := s.m.Stats()
	st.Asks, st.GaveBackPages = ms.Asked, int(ms.GivenBack/pb)
	st.Preemptions = s.preemptions()
	// The other server may still ask this one while it ends: leave first.
	if err := s.close(); err != nil {
		return fail(err)
	}
	if err := b.Close(); err != nil {
		return fail(err)
	}
	data, _ := json.Marshal(st)
	fmt.Fprintf(stdout, "stats %s\n", data)
	return 0
}

// simResult is one configuration's run.
type simResult struct {
	Name        string        `json:"name"`
	Floor       int           `json:"floor_pages"`
	Ceiling     int           `json:"ceiling_pages"`
	Servers     []serverStats `json:"servers"`
	Served      int           `json:"served"`
	Arrived     int           `json:"arrived"`
	OverCommits int           `json:"over_commits"`
	PeakPages   int           `json:"peak_committed_pages"`
	WallSec     float64       `json:"wall_s"`
	CPUSec      float64       `json:"cpu_s"` // the servers' processes, user and system
}

// runSim runs both servers (or, pooled, the one server of both traces:
// pooledServer) in lock step over one book with the given floor and
// ceiling each, checking after every step that the books are never
// over-committed.
func runSim(cfg simConfig, name string, floor, ceiling int, pooled bool, self string, env []string) (simResult, error) {
	res := simResult{Name: name, Floor: floor, Ceiling: ceiling}
	dir, err := os.MkdirTemp("", "vmarena-budget-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "book")
	capacity := uint64(cfg.Pages) * cfg.PageBytes
	book, err := budget.Open(path, budget.Options{Capacity: capacity})
	if err != nil {
		return res, err
	}
	defer book.Close()
	type child struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Reader
	}
	start := time.Now()
	var kids []child
	defer func() {
		for _, c := range kids {
			_ = c.in.Close()
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
	}()
	servers := []int{0, 1}
	if pooled {
		servers = []int{pooledServer}
	}
	for _, k := range servers {
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = append(append(os.Environ(), env...), serverEnv+"=1")
		in, err := cmd.StdinPipe()
		if err != nil {
			return res, err
		}
		outp, err := cmd.StdoutPipe()
		if err != nil {
			return res, err
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return res, err
		}
		c := child{cmd: cmd, in: in, out: bufio.NewReader(outp)}
		kids = append(kids, c)
		hello, _ := json.Marshal(map[string]any{"config": cfg, "k": k, "Floor": floor, "Ceil": ceiling, "Book": path, "GiveBackWaitS": 600.0})
		fmt.Fprintf(in, "%s\n", hello)
		if line, err := c.out.ReadString('\n'); err != nil || line != "ready\n" {
			return res, fmt.Errorf("server %d: %q %v", k, line, err)
		}
	}
	for t := 0; t < cfg.Steps; t++ {
		for i := range kids {
			k := (t + i) % len(kids) // each server goes first every other step
			fmt.Fprintf(kids[k].in, "step %d\n", t)
			line, err := kids[k].out.ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "ok ") {
				return res, fmt.Errorf("server %d at step %d: %q %v", k, t, line, err)
			}
			var used, held uint64
			if _, err := fmt.Sscanf(line, "ok %d %d", &used, &held); err != nil || used > held {
				res.OverCommits++ // a server's device committing more than it holds
			}
		}
		in, err := book.Members()
		if err != nil {
			return res, err
		}
		var sum uint64
		for _, m := range in {
			sum += max(m.Committed, m.Floor)
		}
		if sum > capacity {
			res.OverCommits++
		}
		var committed uint64
		for _, m := range in {
			committed += m.Committed
		}
		res.PeakPages = max(res.PeakPages, int(committed/cfg.PageBytes))
	}
	for k, c := range kids {
		fmt.Fprintln(c.in, "end")
		line, err := c.out.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "stats ") {
			return res, fmt.Errorf("server %d at the end: %q %v", k, line, err)
		}
		var st serverStats
		if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "stats ")), &st); err != nil {
			return res, err
		}
		res.Servers = append(res.Servers, st)
		res.Served += st.Served
		res.Arrived += st.Arrived
	}
	for _, c := range kids {
		_ = c.in.Close()
		if err := c.cmd.Wait(); err != nil {
			return res, err
		}
		res.CPUSec += (c.cmd.ProcessState.UserTime() + c.cmd.ProcessState.SystemTime()).Seconds()
	}
	kids = nil
	res.WallSec = time.Since(start).Seconds()
	return res, nil
}
