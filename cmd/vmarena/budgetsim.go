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
	"sync"
	"time"

	"github.com/vmarena/vmarena/budget"
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
}

func defaultSim() simConfig {
	return simConfig{Seed: 1, Steps: 800, Phase: 100, Pages: 128, PageBytes: 2 << 20, TTFTBound: 10, StepMillis: 50,
		HighRate: 0.7, LowRate: 0.05}
}

// simRequest is one request of a server's trace.
type simRequest struct {
	Arrive, Pages, Steps int
}

// trace generates server k's requests: Poisson arrivals at HighRate in
// its peaks and LowRate between, the peaks of the two servers alternating.
func (c simConfig) trace(k int) []simRequest {
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
	PeakPages      int     `json:"peak_pages"`
	Asks           int     `json:"asked"` // requests to give back it answered
	GaveBackPages  int     `json:"gave_back_pages"`
	MaxAskWallSec  float64 `json:"max_acquire_wall_s"`
	MeanStepWall   float64 `json:"mean_step_wall_s"`
	AsksOverOneStp int     `json:"acquires_over_one_step"` // Acquires whose wall passed a step's simulated time
}

// server is one simulated serving process.
type server struct {
	cfg   simConfig
	m     *budget.Member
	mu    sync.Mutex
	trace []simRequest
	next  int
	queue []simRequest
	run   []int // end step of each running request, beside its pages
	runPg []int
	used  int // pages of running requests
	idle  int // pages cached after their requests finished (prefix cache)
	held  int // pages acquired from the budget: used + idle
	st    serverStats
	ttft  int
	steps time.Duration
}

// giveBack drops cached pages for another member.
func (s *server) giveBack(want uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(int((want+s.cfg.PageBytes-1)/s.cfg.PageBytes), s.idle)
	if n == 0 {
		return
	}
	if err := s.m.Release(uint64(n) * s.cfg.PageBytes); err != nil {
		return
	}
	s.idle -= n
	s.held -= n
	s.st.GaveBackPages += n
	_ = s.m.SetIdle(uint64(s.idle) * s.cfg.PageBytes)
}

// step runs step t.
func (s *server) step(t int) error {
	start := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	// Finished requests leave their pages cached.
	for i := 0; i < len(s.run); {
		if s.run[i] <= t {
			s.used -= s.runPg[i]
			s.idle += s.runPg[i]
			s.run = slices.Delete(s.run, i, i+1)
			s.runPg = slices.Delete(s.runPg, i, i+1)
			continue
		}
		i++
	}
	for s.next < len(s.trace) && s.trace[s.next].Arrive <= t {
		s.queue = append(s.queue, s.trace[s.next])
		s.st.Arrived++
		s.next++
	}
	// Requests past the TTFT bound are not served.
	for len(s.queue) > 0 && t-s.queue[0].Arrive > s.cfg.TTFTBound {
		s.queue = s.queue[1:]
		s.st.Dropped++
	}
	for len(s.queue) > 0 {
		r := s.queue[0]
		need := r.Pages
		fromIdle := min(need, s.idle)
		if more := need - fromIdle; more > 0 {
			// Lock step: the other server waits for the driver, so only
			// this Acquire's asks run its give-back now.
			t0 := time.Now()
			err := s.m.Acquire(uint64(more) * s.cfg.PageBytes)
			d := time.Since(t0)
			s.st.MaxAskWallSec = max(s.st.MaxAskWallSec, d.Seconds())
			if d > time.Duration(s.cfg.StepMillis)*time.Millisecond {
				s.st.AsksOverOneStp++
			}
			if err != nil {
				break
			}
			s.held += more
		}
		s.idle -= fromIdle
		s.used += need
		s.queue = s.queue[1:]
		s.run = append(s.run, t+r.Steps)
		s.runPg = append(s.runPg, need)
		s.st.Served++
		s.ttft += t - r.Arrive
	}
	s.st.PeakPages = max(s.st.PeakPages, s.used+s.idle)
	if err := s.m.SetIdle(uint64(s.idle) * s.cfg.PageBytes); err != nil {
		return err
	}
	s.steps += time.Since(start)
	return nil
}

// serveBudget is a re-executed vmarena's life as one server: it reads its
// configuration and steps from stdin, answers each on stdout, and ends
// with its stats.
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
	s := &server{cfg: hello.Config, trace: hello.Config.trace(hello.K)}
	pb := hello.Config.PageBytes
	if s.m, err = b.Join(fmt.Sprintf("server-%d", hello.K), uint64(hello.Floor)*pb, uint64(hello.Ceil)*pb, s.giveBack); err != nil {
		return fail(err)
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
		s.mu.Lock()
		fmt.Fprintf(stdout, "ok %d %d\n", s.used, s.held)
		s.mu.Unlock()
	}
	s.mu.Lock()
	if s.st.Served > 0 {
		s.st.MeanTTFTSteps = float64(s.ttft) / float64(s.st.Served)
	}
	if n := hello.Config.Steps; n > 0 {
		s.st.MeanStepWall = s.steps.Seconds() / float64(n)
	}
	st := s.st
	s.mu.Unlock()
	if in, err := s.m.Info(); err == nil {
		st.Asks = int(in.Asked)
	}
	// The other server may still ask this one while it ends: leave first.
	if err := s.m.Close(); err != nil {
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

// runSim runs both servers in lock step over one book with the given
// floor and ceiling each, checking after every step that the books are
// never over-committed.
func runSim(cfg simConfig, name string, floor, ceiling int, self string, env []string) (simResult, error) {
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
	for k := 0; k < 2; k++ {
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
		for i := 0; i < 2; i++ {
			k := (t + i) % 2 // each server goes first every other step
			fmt.Fprintf(kids[k].in, "step %d\n", t)
			line, err := kids[k].out.ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "ok ") {
				return res, fmt.Errorf("server %d at step %d: %q %v", k, t, line, err)
			}
			var used, held int
			if _, err := fmt.Sscanf(line, "ok %d %d", &used, &held); err != nil || used > held {
				res.OverCommits++ // a server using more than it holds
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
