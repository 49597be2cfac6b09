// Kvcache serves the first requests of the Azure LLM conversation trace
// with a small transformer whose keys and values live in a kvcache.Cache
// on the host driver (real memory, no GPU), prints the cache's memory map
// as it grows and shrinks, and the cache's statistics at the end.
//
//	go run ./examples/kvcache [-requests 300] [-scale 64] [-metrics ADDR]
//
// The model is internal/transformer's: 4 layers, 8 heads of 64, a
// vocabulary of 256, weights drawn from a seed. It computes real logits
// through the cache: what Admit did not find of a prompt in the prefix
// store is appended in one Append and computed position by position, then
// every step decodes one token (greedily, the largest logit) for each
// running sequence, as many sequences at once as there are cores.
//
// What is made up, and said so in the output. The trace has lengths but
// no text: each prompt is one of four system prompts of 64 tokens
// (request i takes i mod 4) followed by tokens of its own, pseudo-random
// from a seed of i. Lengths are scaled down, since this plain-Go model
// computes a few hundred positions a second on two cores: a request's own
// tokens are the trace's prompt tokens divided by -scale (default 64), its
// output the trace's divided by -scale, each at least 1 and capped so that
// the whole fits the cache's 256 tokens of context. The trace's timestamps
// are not replayed: requests wait in trace order and are admitted while a
// slot is free and CanAdmit says their prompt and output fit.
//
// The system prompts are what the prefix store serves: a request whose
// prompt starts with one an earlier request has computed maps its two
// whole pages (no copy, no compute). Half way through, the budget drops
// from 10 MiB to 6 MiB (another model on the device, say): idle and cached
// pages go back and sequences are swapped to host memory. Three quarters
// through it is restored, and they resume. When all are served, a budget
// of one unit gives back the pages idle slots kept and the cached prefix
// pages. One request that shared a prefix is checked against the model's
// recomputation without a cache: its logits must be equal.
//
// With -svg DIR it also draws the memory map into DIR as pictures: the
// first step, the first at which sequences share prefix pages (one chunk
// mapped in several slots), and each change of the budget.
//
// With -metrics ADDR it serves the cache's figures (package metrics:
// vmarena_kvcache_usage_ratio, the prefix hits, the preemptions, ...) at
// http://ADDR/metrics, in Prometheus's text format, while it runs; the
// first line it prints says where (127.0.0.1:0 takes any free port).
//
// A flag it cannot use is a one-line error and exit status 2.
package main

import (
	"bytes"
	_ "embed"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/examples/mapsvg"
	"github.com/vmarena/vmarena/internal/transformer"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/serving"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// traceCSV is the header and the first 300 requests of the Azure LLM
// inference trace of conversations (testdata/README.md says where from).
//
//go:embed testdata/AzureLLMInferenceTrace_conv.csv
var traceCSV []byte

// The cache's shape: the tiny preset (the model's keys and values, float32)
// in the PerLayer layout with 64 KiB pages, so that a unit of commit is 32
// tokens in each of the 8 regions (512 KiB), and a slot of 256 tokens is 8
// units: one character each in the memory map.
const (
	page       = 64 * units.KiB
	maxSeqs    = 8
	maxContext = 256
	capacity   = 64 * units.MiB
	budget     = 10 * units.MiB
	cutBudget  = 6 * units.MiB // from half way through to three quarters
	// unit is a unit of commit: a page in each of the 2*Layers = 8 regions.
	unit = 8 * page
)

// Prompts: systemPrompts system prompts of systemTokens tokens, four
// blocks of 16 that fill two whole units, which a request that shares
// them borrows. (A system prompt that ended inside a unit would have the
// rest of it copied, but only from a prompt that filled that unit, and
// scaled prompts are short: most requests would compute it again.)
const (
	systemPrompts = 4
	systemTokens  = 64
)

// modelSeed draws the model's weights.
const modelSeed = 11

const (
	defaultRequests = 300
	defaultScale    = 64
)

// config is what the flags set.
type config struct {
	requests int    // the first requests of the trace to serve
	scale    int    // lengths are the trace's divided by scale
	metrics  string // where to serve the cache's metrics, host:port ("": nowhere)
	svg      string // where to draw the memory map at key steps ("": nowhere)
	// served, when set, is called with the URL of the metrics once every
	// request is served and the report printed, the cache still open:
	// the test scrapes the end of the run there.
	served func(metricsURL string) error
}

func main() { os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr)) }

// realMain parses args, runs, and returns the exit status: 2 for a flag
// it cannot use, 1 for a failure.
func realMain(args []string, stdout, stderr io.Writer) int {
	trace, err := serving.ParseAzure(bytes.NewReader(traceCSV))
	if err != nil {
		fmt.Fprintf(stderr, "kvcache: the embedded trace: %v\n", err)
		return 1
	}
	fs := flag.NewFlagSet("kvcache", flag.ContinueOnError)
	// The flag package's complaint is one line; its usage goes out only
	// when asked for (-h).
	var usage bytes.Buffer
	fs.SetOutput(&usage)
	cfg := config{}
	fs.IntVar(&cfg.requests, "requests", defaultRequests, fmt.Sprintf("serve the first `N` requests of the trace (1 to %d)", len(trace)))
	fs.IntVar(&cfg.scale, "scale", defaultScale, "divide the trace's prompt and output lengths by `S` (at least 1)")
	fs.StringVar(&cfg.svg, "svg", "", "draw the memory map at key steps as SVG pictures into `DIR` (made if need be)")
	fs.StringVar(&cfg.metrics, "metrics", "", "serve the cache's Prometheus metrics at http://`ADDR`/metrics while the example runs (127.0.0.1:0: any free port)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, _ = stderr.Write(usage.Bytes())
			return 0
		}
		fmt.Fprintf(stderr, "kvcache: %v\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvcache: unexpected argument %q; the flags are -requests N, -scale S, -svg DIR and -metrics ADDR\n", fs.Arg(0))
		return 2
	}
	if err := cfg.check(len(trace)); err != nil {
		fmt.Fprintf(stderr, "kvcache: %v\n", err)
		return 2
	}
	if err := run(stdout, cfg); err != nil {
		fmt.Fprintf(stderr, "kvcache: %v\n", err)
		return 1
	}
	return 0
}

// check refuses flags the example cannot use.
func (cfg config) check(traceRequests int) error {
	if cfg.requests < 1 || cfg.requests > traceRequests {
		return errors.Newf("-requests %d: the embedded trace has requests 1 to %d", cfg.requests, traceRequests)
	}
	if cfg.scale < 1 {
		return errors.Newf("-scale %d: lengths are divided by at least 1", cfg.scale)
	}
	return nil
}

// request is one request of the trace as the example serves it.
type request struct {
	id     int // its index in the trace, from 0
	trace  serving.Request
	prompt []int
	output int // tokens to generate
	capped bool
	// matched is how many prompt tokens the prefix store held at Admit.
	matched int

	seq *kvcache.Seq
	kv  *seqKV
	// generated is how many tokens it has generated; next is the last of
	// them, to be appended (and computed) at the next step.
	generated, next int
	// logits are those of every position it computed, kept for the
	// request whose logits are checked (nil for the others).
	logits map[int][]float32
}

// makeRequests turns the first n requests of the trace into prompts and
// output lengths: a system prompt, then the request's own tokens, as many
// as the trace's prompt divided by scale, and an output of the trace's
// divided by scale.
func makeRequests(trace []serving.Request, n, scale int) []*request {
	system := make([][]int, systemPrompts)
	for i := range system {
		system[i] = randomTokens(rand.New(rand.NewPCG(uint64(i), 0x5957e3)), systemTokens)
	}
	reqs := make([]*request, n)
	for i, tr := range trace[:n] {
		own, out := scaled(tr.Input, scale), scaled(tr.Output, scale)
		r := &request{id: i, trace: tr, output: out}
		if room := maxContext - systemTokens; own+out > room {
			r.capped = true
			r.output = min(out, room/2)
			own = room - r.output
		}
		r.prompt = append(slices.Clone(system[i%systemPrompts]), randomTokens(rand.New(rand.NewPCG(uint64(i), 1)), own)...)
		reqs[i] = r
	}
	return reqs
}

// scaled is n tokens divided by scale, rounded, and at least 1.
func scaled(n, scale int) int { return max(1, (n+scale/2)/scale) }

func randomTokens(rng *rand.Rand, n int) []int {
	t := make([]int, n)
	for i := range t {
		t[i] = rng.IntN(transformer.DefaultConfig().Vocab)
	}
	return t
}

// seqKV is a sequence of the cache seen as the model's KV store: Store
// writes into the rows the last Append handed out, Load reads the
// sequence's K and V tensors, which attention reads on a GPU. In the
// PerLayer layout both are contiguous [tokens, KVHeads, HeadDim].
type seqKV struct {
	seq  *kvcache.Seq
	step kvcache.Step
	// k[l] and v[l] are layer l's keys and values as of the last Append,
	// read from the cache on the first Load after it (nil until then).
	// They alias the cache's memory: valid while the sequence runs, and
	// dropped at every Append, before anything can preempt it.
	k, v [][]float32
}

func newSeqKV(s *kvcache.Seq, layers int) *seqKV {
	return &seqKV{seq: s, k: make([][]float32, layers), v: make([][]float32, layers)}
}

// appended takes the views of the rows an Append made room for.
func (a *seqKV) appended(step kvcache.Step) {
	a.step = step
	clear(a.k)
	clear(a.v)
}

func (a *seqKV) Store(layer, pos int, k, v []float32) error {
	for _, r := range a.step.Layers[layer] {
		if n := r.K.Shape()[0]; pos < r.Pos || pos >= r.Pos+n {
			continue
		}
		for _, x := range []struct {
			dst *tensor.Tensor
			src []float32
		}{{r.K, k}, {r.V, v}} {
			d, err := tensor.Data[float32](x.dst)
			if err != nil {
				return err
			}
			copy(d[(pos-r.Pos)*len(x.src):], x.src)
		}
		return nil
	}
	return errors.AssertionFailedf("kvcache example: position %d is not among the rows the last Append handed out (%d from %d)",
		pos, a.step.N, a.step.Pos)
}

func (a *seqKV) Load(layer, pos int, k, v []float32) error {
	if a.k[layer] == nil {
		for _, x := range []struct {
			get func(int) (*tensor.Tensor, error)
			dst *[]float32
		}{{a.seq.K, &a.k[layer]}, {a.seq.V, &a.v[layer]}} {
			t, err := x.get(layer)
			if err != nil {
				return err
			}
			if *x.dst, err = tensor.Data[float32](t); err != nil {
				return err
			}
		}
	}
	w := len(k)
	if (pos+1)*w > len(a.k[layer]) {
		return errors.AssertionFailedf("kvcache example: load of position %d from a sequence of %d", pos, len(a.k[layer])/w)
	}
	copy(k, a.k[layer][pos*w:])
	copy(v, a.v[layer][pos*w:])
	return nil
}

// job is one sequence's work in a step: the tokens its last Append made
// room for, from position pos, and the logits computed for them.
type job struct {
	r      *request
	tokens []int
	pos    int
	logits [][]float32
	err    error
}

// compute runs every job, as many at once as there are cores: the model
// is safe for concurrent use, and each job writes its own sequence.
func compute(m *transformer.Model, jobs []*job) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(jobs) {
					return
				}
				j := jobs[i]
				j.logits, j.err = m.Prefill(j.r.kv, j.tokens, j.pos)
			}
		}()
	}
	wg.Wait()
	var err error
	for _, j := range jobs {
		err = errors.CombineErrors(err, j.err)
	}
	return err
}

// plural is "1 one" or "n many".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// server is the state of a run: the cache, the model, and the requests
// waiting, running and swapped out.
type server struct {
	w     io.Writer
	c     *kvcache.Cache
	m     *transformer.Model
	reqs  []*request
	bySeq map[*kvcache.Seq]*request
	// queued is the next request to admit; running and swapped are kept
	// in admission (trace) order: the latest admitted is preempted first,
	// the earliest resumed first.
	queued           int
	running, swapped []*request
	served           int
	step             int
	// computed and fromStore count prompt and output positions the model
	// computed, and prompt positions the prefix store held.
	computed, fromStore int
	oomPreemptions      int
	// checked is the request whose logits are compared with a full
	// recomputation (nil until one that shared a prefix is admitted), and
	// checkLine what the comparison found.
	checked   *request
	checkLine string
	tpu       int // tokens a unit holds
	// pics draws the memory map (nil without -svg); drewSharing is set
	// once it drew the first step with shared pages.
	pics        *mapsvg.Recorder
	drewSharing bool
	// printed is the step of the last snapshot printed; peak the Stats of
	// the step with the most memory that sharing spared.
	printed, peakStep int
	peak              kvcache.Stats
}

func run(w io.Writer, cfg config) (err error) {
	trace, err := serving.ParseAzure(bytes.NewReader(traceCSV))
	if err != nil {
		return errors.Wrap(err, "the embedded trace")
	}
	if err := cfg.check(len(trace)); err != nil {
		return err
	}
	start := time.Now()
	m, err := transformer.New(transformer.DefaultConfig(), modelSeed)
	if err != nil {
		return err
	}
	drv, err := host.New(host.Options{Devices: 1, Capacity: capacity, Granularity: page})
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, drv.Close()) }()
	rec, pics, err := mapsvg.Record(drv, cfg.svg)
	if err != nil {
		return err
	}
	kc, err := kvcache.Preset("tiny")
	if err != nil {
		return err
	}
	kc.MaxContext, kc.MaxSeqs, kc.PageSize, kc.Budget, kc.Layout = maxContext, maxSeqs, page, budget, kvcache.PerLayer
	c, err := kvcache.New(vaspace.New(rec), physical.New(rec), kc)
	if err != nil {
		return err
	}
	defer func() { err = errors.CombineErrors(err, c.Close()) }()
	metricsURL := ""
	if cfg.metrics != "" {
		var stop func() error
		if metricsURL, stop, err = serveMetrics(w, cfg.metrics, c); err != nil {
			return err
		}
		defer func() { err = errors.CombineErrors(err, stop()) }() // before the cache closes
	}
	row := kc.KVHeads * kc.HeadDim * kc.DType.Size()

	s := &server{w: w, c: c, m: m, reqs: makeRequests(trace, cfg.requests, cfg.scale),
		bySeq: map[*kvcache.Seq]*request{}, tpu: int(page) / row, pics: pics}
	s.header(cfg)
	if err := s.serve(); err != nil {
		return err
	}
	if err := c.Check(); err != nil {
		return err
	}
	if err := s.report(time.Since(start)); err != nil || cfg.served == nil {
		return err
	}
	return cfg.served(metricsURL)
}

// header says what the run is, what is made up, and how to read the map.
func (s *server) header(cfg config) {
	mc := s.m.Config()
	var own, out, tin, tout, capped int
	for _, r := range s.reqs {
		own, out = own+len(r.prompt)-systemTokens, out+r.output
		tin, tout = tin+r.trace.Input, tout+r.trace.Output
		if r.capped {
			capped++
		}
	}
	n := float64(len(s.reqs))
	p := func(format string, args ...any) { fmt.Fprintf(s.w, format+"\n", args...) }
	p("A transformer of %d layers, %d heads of %d and a vocabulary of %d (weights from seed %d) serves the first",
		mc.Layers, mc.Heads, mc.HeadDim, mc.Vocab, modelSeed)
	p("%d requests of the Azure LLM conversation trace through a KV cache on the host driver.", len(s.reqs))
	p("The trace gives lengths, no text: each prompt is one of %d system prompts of %d tokens (request i takes",
		systemPrompts, systemTokens)
	p("i mod %d), then tokens of its own, pseudo-random from seed i. Lengths are scaled down %d times: a request's",
		systemPrompts, cfg.scale)
	p("own tokens are %.0f on average (trace prompts: %.0f), its output %.0f (trace: %.0f); at least 1 each, and",
		float64(own)/n, float64(tin)/n, float64(out)/n, float64(tout)/n)
	p("%d requests capped to fit %d tokens. Decoding is greedy. Timestamps are not replayed: requests are",
		capped, maxContext)
	p("admitted in trace order while a slot is free and CanAdmit says their prompt and output fit.")
	p("%s; budget %s.", s.c, units.Bytes(budget))
	p("")
	p("Memory map, slot by slot, a character a unit (%d tokens of every layer's K and V: %s):", s.tpu, units.Bytes(unit))
	p("'#' a running sequence's own, '*' borrowed from the prefix store, '+' committed past its last token,")
	p("'~' being committed, '-' kept by an idle slot for its next sequence, 's' swapped out, '.' not committed.")
	slots := make([]string, maxSeqs)
	for i := range slots {
		slots[i] = fmt.Sprintf("%-*s", maxContext/s.tpu, fmt.Sprintf("slot %d", i))
	}
	p("%5s %5s %4s %4s %4s  %s  %9s %9s", "step", "done", "run", "swap", "wait", strings.Join(slots, " "), "committed", "saved")
}

// serve runs steps until every request is served.
func (s *server) serve() error {
	every := max(1, s.estimateSteps()/16)
	cut, restored := false, false
	for s.served < len(s.reqs) {
		s.step++
		jobs, err := s.schedule()
		if err != nil {
			return err
		}
		if len(jobs) == 0 {
			// The budget always holds one sequence of maxContext tokens.
			return errors.AssertionFailedf("kvcache example: step %d: nothing runs (%d swapped, %d waiting): %+v",
				s.step, len(s.swapped), len(s.reqs)-s.queued, s.c.Stats())
		}
		if err := compute(s.m, jobs); err != nil {
			return err
		}
		if err := s.finish(jobs); err != nil {
			return err
		}
		if st := s.c.Stats(); st.SavedBytes > s.peak.SavedBytes {
			s.peak, s.peakStep = st, s.step
		}
		if err := s.stepPictures(); err != nil {
			return err
		}
		switch {
		case !cut && s.queued >= len(s.reqs)/2:
			cut = true
			if err := s.setBudget(cutBudget, "another model needs "+units.Bytes(budget-cutBudget)); err != nil {
				return err
			}
		case cut && !restored && s.queued >= len(s.reqs)*3/4:
			restored = true
			if err := s.setBudget(budget, "restored"); err != nil {
				return err
			}
		case s.step == 1 || s.step%every == 0:
			s.snapshot()
		}
	}
	if s.printed != s.step {
		s.snapshot()
	}
	return s.setBudget(unit, "all served")
}

// estimateSteps is about how many steps the run takes: every output
// token, maxSeqs at a time.
func (s *server) estimateSteps() int {
	out := 0
	for _, r := range s.reqs {
		out += r.output
	}
	return out / maxSeqs
}

// schedule prepares a step: swapped sequences resume while they fit,
// every running sequence appends its last token (preempting the latest
// admitted when the budget cannot hold it), and new requests are admitted
// while CanAdmit says yes. It returns the work of the step.
func (s *server) schedule() ([]*job, error) {
	for len(s.swapped) > 0 {
		r := s.swapped[0]
		step, err := r.seq.Resume()
		if errors.Is(err, driver.ErrOutOfMemory) {
			break
		}
		if err != nil {
			return nil, err
		}
		if step.N != 0 {
			return nil, errors.AssertionFailedf("kvcache example: a swapped sequence resumed asking to recompute %d positions", step.N)
		}
		s.swapped = s.swapped[1:]
		s.running = insert(s.running, r)
	}
	var jobs []*job
	for i := 0; i < len(s.running); i++ {
		r := s.running[i]
		step, err := r.seq.Append([]int{r.next})
		for errors.Is(err, driver.ErrOutOfMemory) {
			// The latest admitted goes first: it has not appended yet in
			// this step (running is in admission order), so all its keys
			// and values are written, and swapped whole.
			victim := s.running[len(s.running)-1]
			if err := victim.seq.Preempt(kvcache.Swap); err != nil {
				return nil, err
			}
			s.running = s.running[:len(s.running)-1]
			s.swapped = insert(s.swapped, victim)
			s.oomPreemptions++
			if victim == r {
				break
			}
			step, err = r.seq.Append([]int{r.next})
		}
		if errors.Is(err, driver.ErrOutOfMemory) {
			break // r itself was swapped out, and was the last
		}
		if err != nil {
			return nil, err
		}
		r.kv.appended(step)
		jobs = append(jobs, &job{r: r, tokens: []int{r.next}, pos: step.Pos})
	}
	// New requests wait while swapped ones cannot come back.
	for len(s.swapped) == 0 && s.queued < len(s.reqs) {
		r := s.reqs[s.queued]
		ok, err := s.c.CanAdmit(r.prompt, 0, r.output)
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		seq, err := s.c.Admit(r.prompt, 0)
		if err != nil {
			return nil, err
		}
		matched := seq.Len()
		step, err := seq.Append(r.prompt[matched:])
		if errors.Is(err, driver.ErrOutOfMemory) {
			if err := seq.Free(); err != nil {
				return nil, err
			}
			break
		}
		if err != nil {
			return nil, errors.CombineErrors(err, seq.Free())
		}
		r.seq, r.kv, r.matched = seq, newSeqKV(seq, s.m.Config().Layers), matched
		r.kv.appended(step)
		s.bySeq[seq] = r
		s.fromStore += matched
		if s.checked == nil && matched > 0 && r.output > 1 {
			s.checked, r.logits = r, map[int][]float32{}
		}
		s.queued++
		s.running = append(s.running, r)
		jobs = append(jobs, &job{r: r, tokens: r.prompt[matched:], pos: matched})
	}
	return jobs, nil
}

// insert puts r into rs, kept in trace order.
func insert(rs []*request, r *request) []*request {
	i, _ := slices.BinarySearchFunc(rs, r.id, func(x *request, id int) int { return x.id - id })
	return slices.Insert(rs, i, r)
}

// finish marks each job's rows written (its whole prompt pages become
// shareable), takes its last logits as its next token, and frees the
// sequences that have generated all their output.
func (s *server) finish(jobs []*job) error {
	for _, j := range jobs {
		r := j.r
		if err := r.seq.MarkWritten(j.pos + len(j.tokens)); err != nil {
			return err
		}
		s.computed += len(j.tokens)
		if r.logits != nil {
			for i, lg := range j.logits {
				r.logits[j.pos+i] = lg
			}
		}
		r.next = transformer.Greedy(j.logits[len(j.logits)-1])
		r.generated++
		if r.generated < r.output {
			continue
		}
		if r == s.checked {
			if err := s.check(r); err != nil {
				return err
			}
		}
		if err := r.seq.Free(); err != nil {
			return err
		}
		delete(s.bySeq, r.seq)
		r.seq, r.kv, r.logits = nil, nil, nil
		s.running = slices.DeleteFunc(s.running, func(x *request) bool { return x == r })
		s.served++
	}
	return nil
}

// check compares the logits r computed through the cache with the model's
// full recomputation of its tokens, without a cache.
func (s *server) check(r *request) error {
	tokens := r.seq.Tokens()
	want, err := s.m.Forward(tokens)
	if err != nil {
		return err
	}
	worst := 0.0
	for pos, got := range r.logits {
		for i := range got {
			worst = max(worst, math.Abs(float64(got[i]-want[pos][i])))
		}
	}
	s.checkLine = fmt.Sprintf("Request %d (%d of its %d prompt tokens from the prefix store): its logits at the %d positions it computed\n"+
		"match the full recomputation without a cache: max |diff| = %g.",
		r.id, r.matched, len(r.prompt), len(r.logits), worst)
	if worst > 1e-4 {
		return errors.AssertionFailedf("kvcache example: request %d's logits differ from the full recomputation by %g", r.id, worst)
	}
	return nil
}

// setBudget changes the cache's budget between steps, when every
// sequence's keys and values are written, and prints what it gave back
// and the map: what it swaps out waits to resume.
func (s *server) setBudget(b uint64, why string) error {
	before := s.c.Stats()
	pre, err := s.c.SetBudget(b, kvcache.Swap)
	for _, seq := range pre {
		r := s.bySeq[seq]
		s.running = slices.DeleteFunc(s.running, func(x *request) bool { return x == r })
		s.swapped = insert(s.swapped, r)
	}
	if err != nil {
		return err
	}
	after := s.c.Stats()
	fmt.Fprintf(s.w, "%27s budget %s (%s): %d idle or surplus and %d cached pages given back, %s swapped out\n", "--",
		units.Bytes(b), why, after.ReclaimedPages-before.ReclaimedPages, after.EvictedPages-before.EvictedPages,
		plural(len(pre), "sequence", "sequences"))
	s.snapshot()
	return s.budgetPicture(b, why, len(pre))
}

// snapshot prints the memory map: a character a unit, slot by slot.
func (s *server) snapshot() {
	var b strings.Builder
	for i, o := range s.c.Occupancy() {
		if i > 0 {
			b.WriteByte(' ')
		}
		filled := (o.Tokens + s.tpu - 1) / s.tpu
		for u, st := range o.Units {
			b.WriteByte(unitChar(o, u, st, filled))
		}
	}
	st := s.c.Stats()
	mib := func(x uint64) float64 { return float64(x) / float64(units.MiB) }
	fmt.Fprintf(s.w, "%5d %5d %4d %4d %4d  %s  %5.1f MiB %5.1f MiB\n", s.step, s.served, len(s.running), len(s.swapped),
		len(s.reqs)-s.queued, b.String(), mib(st.Committed), mib(st.SavedBytes))
	s.printed = s.step
}

// unitChar is unit u's character in the memory map; filled is the units
// the slot's tokens reach.
func unitChar(o kvcache.SlotOccupancy, u int, st kvcache.UnitState, filled int) byte {
	switch st {
	case kvcache.UnitBorrowed:
		return '*'
	case kvcache.UnitCommitting:
		return '~'
	case kvcache.UnitOwned:
		switch {
		case o.State == kvcache.SlotIdle:
			return '-'
		case u >= filled:
			return '+'
		}
		return '#'
	}
	if o.State == kvcache.SlotPreempted && u < filled {
		return 's'
	}
	return '.'
}

// report prints what was served, the logits check, and every figure of
// the cache's Stats.
func (s *server) report(wall time.Duration) error {
	var prompt, out int
	for _, r := range s.reqs {
		prompt, out = prompt+len(r.prompt), out+r.output
	}
	fmt.Fprintf(s.w, "\nServed %d requests in %d steps: %d prompt tokens (%d of them found in the prefix store, not computed)\n",
		s.served, s.step, prompt, s.fromStore)
	fmt.Fprintf(s.w, "and %d generated. The model computed %d positions in %.1f s (%.0f a second, on %d cores).\n",
		out, s.computed, wall.Seconds(), float64(s.computed)/wall.Seconds(), runtime.GOMAXPROCS(0))
	st := s.c.Stats()
	fmt.Fprintf(s.w, "Prefix sharing: %d of the %d prompt blocks looked up were found in the store. ", st.PrefixHits, st.PrefixQueries)
	if s.peak.SavedBytes > 0 {
		fmt.Fprintf(s.w, "At the peak (step %d),\n%d running sequences mapped %d store pages that two or more of them shared, sparing %s.\n",
			s.peakStep, s.peak.Running, s.peak.SharedPages, units.Bytes(s.peak.SavedBytes))
	} else {
		fmt.Fprintf(s.w, "No two running sequences\never mapped the same store page at once.\n")
	}
	fmt.Fprintf(s.w, "%s swapped out when a next token did not fit.\n", plural(s.oomPreemptions, "sequence was", "sequences were"))
	if s.checkLine != "" {
		fmt.Fprintln(s.w, s.checkLine)
	}
	fmt.Fprintf(s.w, "\nkvcache.Stats at the end:\n")
	tw := tabwriter.NewWriter(s.w, 0, 0, 1, ' ', 0)
	fields := reflect.ValueOf(st)
	for i := range fields.NumField() {
		f := fields.Field(i)
		v := fmt.Sprint(f.Interface())
		if f.Kind() == reflect.Uint64 { // every uint64 of Stats is bytes
			v = units.Bytes(f.Uint())
		}
		sep := "\t"
		if i%3 == 2 || i == fields.NumField()-1 {
			sep = "\n"
		}
		fmt.Fprintf(tw, "  %s\t%s%s", fields.Type().Field(i).Name, v, sep)
	}
	return tw.Flush()
}
