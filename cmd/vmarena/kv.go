package main

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/progress"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/kvevents"
	"github.com/vmarena/vmarena/serving"
)

const kvUsage = `usage: vmarena kv simulate --trace FILE --model PRESET|CONFIG.json [--memory 80GiB]
                           [--layout auto|token-major|contiguous|per-layer] [--page-size 2MiB]
                           [--preempt drop|swap] [--admit prompt|expected-output] [--limit N]
                           [--max-context TOKENS] [--max-seqs 256] [--max-batched-tokens 8192]
                           [--prices a100|h100] [--map-ahead=false] [--admit-ahead]
                           [--warm budget|step] [--scheme auto|uniform|hybrid] [--report FILE] [--json]
                           [--kv-events tcp://HOST:PORT|ipc://PATH [--kv-events-topic TOPIC]
                            [--kv-events-replay ENDPOINT] [--kv-events-layout array|map]
                            [--kv-events-dp-rank 0] [--kv-events-vllm-hash-seed SEED]
                            [--kv-events-linger 1s]]

Serves a request trace (an Azure LLM inference or BurstGPT trace .csv, or a
Mooncake or Qwen-Bailian trace .jsonl, whose hash_ids name shared prompt
blocks; its first --limit requests when given) with continuous batching,
once for each way of holding the KV memory, with the same budget and the
same step prices, and prints their figures side by side: this library's
cache (package kvcache on the sim driver, its memory the budget, laid out
as --layout — auto: kvcache.PickLayout's, the layout of least worst-case
waste per sequence for the model and page — in pages of --page-size,
preempting as --preempt, admitting as --admit), a paged block table (vLLM:
16-token blocks, prefix caching, recompute preemption) and a static
reservation of the maximum context for every sequence. --memory is the KV
memory's budget. The max context defaults to the trace's longest request,
as much as the budget holds for one sequence; longer requests are refused.

Each scheme's driver calls are counted by kind and priced by --prices (the
sim driver's table measured on an A100, or on an H100); with mapping ahead (on
unless --map-ahead=false) this cache's decode commits run in the background
during the step before, and only what exceeds that step's GPU time is
waited for; its page pool is warmed before serving, so that admissions map
pages rather than create them: with the whole budget (--warm budget, as
vLLM allocates its KV cache at start-up; at most the memory of every token
of the trace; the hybrid cache's groups' pools share it by the bytes a
token keeps in each, where --warm budget is given), or with a step's
tokens (--warm step, the hybrid cache's default: the rest is created as
the load first needs it, warmed during steps and in idle gaps as their
time pays for). Steps wait for the exposed driver time, so TTFT and
throughput pay for it. --admit-ahead schedules a step ahead, as an engine whose scheduler runs
while the GPU computes: admissions, the next prompt chunks' pages (this
cache's Seq.Reserve) and the last step's frees are made during a step, for
every scheme, and only what exceeds its GPU time is waited for. The paged and
static schemes allocate their pool once before serving and
make no driver call while they serve. The CPU time is the thread clock's
around each scheme's own calls.

With --kv-events, this cache's KV events (the prefix index's changes:
BlockStored, BlockRemoved, AllBlocksCleared at the end) are published as
vLLM publishes them, on a ZMQ PUB socket listening at that endpoint (tcp,
port 0: a free one, named on stderr; or ipc, a Unix socket), each batch a
message of topic (--kv-events-topic), sequence number and msgpack payload;
--kv-events-replay listens for replay requests (a ROUTER socket, as vLLM's).
--kv-events-dp-rank is the data-parallel rank each batch carries; above 0 it
offsets both endpoints as vLLM's publisher does (tcp: the port plus the rank;
ipc: the path with _dpRANK appended). --kv-events-vllm-hash-seed names every
block by the hash vLLM gives its tokens (sha256_cbor, with PYTHONHASHSEED
set to SEED) instead of by this cache's own prefix hash, so that a router
that hashes prompts itself finds these blocks. The sockets stay
open --kv-events-linger after the run, for subscribers to take the last
batches or replay them.

--scheme picks the schemes: uniform (the three above, every layer keeping
every token), hybrid (this library's hybrid cache, kvcache.Hybrid: a cache a
layer group, sliding windows holding their window, recurrent states a
sequence; and vLLM's hybrid paged manager: one pool of uniform-page blocks
cut among KV cache groups, window blocks freed behind the window, a
recurrent block a sequence) or auto (hybrid for a model with sliding-window
or recurrent layers, uniform else). The hybrid schemes report the KV in use
over the exact need (full layers' tokens, window layers' last window, the
recurrent states); --layout, --preempt, --admit and --kv-events are the
uniform cache's (--map-ahead is both caches').

--model is a preset (llama3.1-8b, llama3.3-70b, qwen2.5-7b, mistral-7b,
deepseek-v3, ...: the flags of vmarena kv simulate -h list them all) or the
path of a Hugging Face config.json, or of the directory that holds one.
`

// kvLayouts are the layouts of this cache --layout accepts, the default
// first: auto is kvcache.PickLayout's, the layout whose worst-case waste
// per sequence is the least for the model and page (token-major where a
// page holds whole tokens, contiguous where it does not); per-layer
// wastes up to a page in each of 2*Layers regions, and its gain, a plain
// contiguous tensor a layer for attention kernels, is not something the
// simulation prices.
var kvLayouts = []string{"auto", "token-major", "contiguous", "per-layer"}

// kvPageMin and kvPageMax bound --page-size: the smallest granularity a
// driver maps (4 KiB, some AMD GPUs) and a page no device maps in one.
const (
	kvPageMin = 4 * units.KiB
	kvPageMax = 1 * units.GiB
)

// kvMemoryMax bounds --memory: the cache's prefix store reserves the
// budget's address space, its slots theirs, both on the sim driver.
const kvMemoryMax = sim.AddressSpace / 2

// kvPreempts are the preemption modes --preempt accepts, the default
// (vLLM's) first.
var kvPreempts = []string{"drop", "swap"}

// kvAdmits are what --admit accepts, the default (vLLM's) first: room
// for the prompt alone, or for the prompt and an expected output.
var kvAdmits = []string{"prompt", "expected-output"}

// kvWarms are what --warm accepts, the default first: the page pool
// warmed before serving with the whole budget (serving.Options.WarmBudget)
// or with a step's tokens.
var kvWarms = []string{"budget", "step"}

// kvSchemeSets are what --scheme accepts, the default first.
var kvSchemeSets = []string{"auto", "uniform", "hybrid"}

// kvCacheScheme is this library's cache as kv simulate runs it: Cache
// (uniform) or HybridCache.
type kvCacheScheme interface {
	serving.Scheme
	String() string
	Reserved() uint64
	MapAhead() int
	Close() error
}

// kvCmd runs `vmarena kv`: its one subcommand is simulate.
func kvCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "simulate" {
		return kvNoSimulate(args, stdout, stderr)
	}
	return kvSimulate(args[1:], stdout, stderr)
}

// kvSimulate runs `vmarena kv simulate`: 0 when every scheme served the
// trace, 1 when the trace could not be read or a simulation failed, 2 on
// bad usage.
func kvSimulate(args []string, stdout, stderr io.Writer) (code int) {
	fs := newFlags("kv simulate", stderr)
	memory := sizeFlag(80 * units.GiB)
	trace := fs.String("trace", "", "the request trace `FILE`: an Azure or BurstGPT trace .csv or a Mooncake or Bailian trace .jsonl")
	model := fs.String("model", "", "the `MODEL`: a preset ("+strings.Join(serving.ModelPresets(), ", ")+") or the path of a Hugging Face config.json (or its directory)")
	fs.Var(&memory, "memory", "the KV memory's budget, a `SIZE` such as 80GiB")
	layout := fs.String("layout", kvLayouts[0], "this cache's `LAYOUT`: "+strings.Join(kvLayouts, " or ")+" (the baselines have none)")
	pageSize := sizeFlag(2 * units.MiB)
	fs.Var(&pageSize, "page-size", "this cache's page, its unit of commit, a `SIZE`: a power of two from 4KiB to 1GiB, a multiple of the driver's granularity (a GPU's 2MiB; the host and sim drivers' 64KiB; some AMD GPUs' 4KiB)")
	preempt := fs.String("preempt", kvPreempts[0], "what this cache's preemption does with a sequence's KV, a `MODE`: drop (recompute it on resume, as vLLM) or swap (to host memory)")
	admit := fs.String("admit", kvAdmits[0], "what room this cache's admission asks for, a `POLICY`: prompt (the prompt's, as vLLM) or expected-output (the prompt's and the mean output of the requests finished so far)")
	limit := fs.Int("limit", 0, "serve only the trace's first `N` requests (0: all); the lines after them are not read")
	maxContext := fs.Int("max-context", 0, "the most `TOKENS` a sequence holds, prompt and output (0: the trace's longest request, as much as the budget holds)")
	maxSeqs := fs.Int("max-seqs", 256, "the most sequences running at once `N` (vLLM's max_num_seqs)")
	maxBatched := fs.Int("max-batched-tokens", serving.DefaultMaxBatchedTokens, "the most `TOKENS` a step computes (vLLM's max_num_batched_tokens)")
	report := fs.String("report", "", "also write an HTML report to `FILE`: each scheme's sequences, KV memory and waste over time, and the table")
	prices := fs.String("prices", "a100", "the `TABLE` of driver call costs: "+strings.Join(sim.CostTableNames(), " or ")+" (measured per call on that GPU)")
	mapAhead := fs.Bool("map-ahead", true, "this cache maps the next pages of running sequences ahead, in the background of the step before (false: every page on the step's path)")
	admitAhead := fs.Bool("admit-ahead", false, "schedule a step ahead: admit, reserve the next prompt chunks' pages and free the finished requests during a step, in the background of its GPU time (every scheme)")
	warm := fs.String("warm", kvWarms[0], "what this cache's page pool is warmed with before serving, mapping ahead: budget (the whole budget, as vLLM allocates its KV cache at start-up; at most every token of the trace) or step (a step's tokens, the rest created as the load first needs it); the hybrid cache's default is step; given budget, its groups share the budget by the bytes a token keeps in each")
	jsonOut := fs.Bool("json", false, jsonHelp)
	schemeSet := fs.String("scheme", kvSchemeSets[0], "the `SCHEMES` compared: auto (hybrid for a model with sliding-window or recurrent layers), uniform (this cache, paged, static) or hybrid (this library's hybrid cache and vLLM's hybrid paged manager)")
	events := fs.String("kv-events", "", "publish this cache's KV events as vLLM does, on a ZMQ PUB socket listening at `ENDPOINT` (tcp://HOST:PORT, HOST * for every interface, PORT 0 for a free one; or ipc://PATH)")
	eventsTopic := fs.String("kv-events-topic", "", "the `TOPIC`, every KV event message's first frame (default none, as vLLM)")
	eventsReplay := fs.String("kv-events-replay", "", "listen for KV event replay requests (a ZMQ ROUTER socket, as vLLM's) at `ENDPOINT`")
	eventsLayout := fs.String("kv-events-layout", "array", "each KV event's msgpack `LAYOUT`: array (msgspec array_like, tag first) or map (tagged map)")
	eventsRank := fs.Int("kv-events-dp-rank", 0, "the data-parallel `RANK` the batches carry; above 0 it offsets both endpoints as vLLM's publisher does (a tcp port by the rank, an ipc path by _dpRANK)")
	eventsSeed := fs.String("kv-events-vllm-hash-seed", "", "name blocks by vLLM's sha256_cbor block hash with PYTHONHASHSEED=`SEED` (as the routers that hash prompts themselves do), not by this cache's own")
	eventsLinger := fs.Duration("kv-events-linger", time.Second, "how long the KV event sockets stay open after the run (`DURATION`), for subscribers to take the last batches")
	if code, ok := parseFlags(fs, "kv simulate", kvUsage, args, stdout, stderr); !ok {
		return code
	}
	usageErr := func(format string, a ...any) int { return usageError(stderr, "kv simulate", format, a...) }
	switch {
	case fs.NArg() > 0:
		return usageErr("unexpected argument %q (the trace is given with --trace)", fs.Arg(0))
	case *trace == "":
		return usageErr("no trace given: want --trace FILE, an Azure or BurstGPT trace .csv or a Mooncake or Bailian trace .jsonl")
	case *model == "":
		return usageErr("no model given: want --model and a preset (%s) or the path of a Hugging Face config.json", strings.Join(serving.ModelPresets(), ", "))
	}
	m, err := serving.LoadModel(*model)
	if err != nil {
		return usageErr("--model %s: %v", *model, err)
	}
	switch {
	case !slices.Contains(kvLayouts, *layout):
		return usageErr("--layout %s: want %s", *layout, strings.Join(kvLayouts, " or "))
	case uint64(pageSize) < kvPageMin || uint64(pageSize) > kvPageMax || uint64(pageSize)&(uint64(pageSize)-1) != 0:
		return usageErr("--page-size %s: want a power of two from %s (the smallest driver granularity) to %s",
			units.Bytes(uint64(pageSize)), units.Bytes(kvPageMin), units.Bytes(kvPageMax))
	case !slices.Contains(kvPreempts, *preempt):
		return usageErr("--preempt %s: want %s", *preempt, strings.Join(kvPreempts, " or "))
	case !slices.Contains(kvAdmits, *admit):
		return usageErr("--admit %s: want %s", *admit, strings.Join(kvAdmits, " or "))
	case !slices.Contains(kvWarms, *warm):
		return usageErr("--warm %s: want %s", *warm, strings.Join(kvWarms, " or "))
	case !slices.Contains(kvSchemeSets, *schemeSet):
		return usageErr("--scheme %s: want %s", *schemeSet, strings.Join(kvSchemeSets, " or "))
	case *limit < 0:
		return usageErr("--limit %d: want a number of requests, or 0 for all", *limit)
	case *maxContext < 0:
		return usageErr("--max-context %d: want a number of tokens, or 0 to fit the trace", *maxContext)
	case *maxSeqs < 1 || *maxSeqs > 1<<20:
		return usageErr("--max-seqs %d: want 1 to %d", *maxSeqs, 1<<20)
	case *maxBatched < 1 || *maxBatched > 1<<24:
		return usageErr("--max-batched-tokens %d: want 1 to %d", *maxBatched, 1<<24)
	case *events == "" && (*eventsTopic != "" || *eventsReplay != "" || flagSet(fs, "kv-events-layout") || flagSet(fs, "kv-events-linger") || flagSet(fs, "kv-events-dp-rank") || flagSet(fs, "kv-events-vllm-hash-seed")):
		return usageErr("--kv-events-topic, --kv-events-replay, --kv-events-layout, --kv-events-dp-rank, --kv-events-vllm-hash-seed and --kv-events-linger need --kv-events")
	case *eventsRank < 0 || *eventsRank > 65535:
		return usageErr("--kv-events-dp-rank %d: want 0 to 65535", *eventsRank)
	case *eventsLinger < 0:
		return usageErr("--kv-events-linger %s: want 0 or more", *eventsLinger)
	}
	hybrid := *schemeSet == "hybrid" || (*schemeSet == "auto" && m.Hybrid())
	// The hybrid cache warms a step's tokens unless --warm budget is
	// given: a budget warm's shares among its groups are a guess the mix
	// of sequences can prove wrong, a release and a create a page moved
	// (docs/serving.md, what an engine pays).
	if hybrid && !flagSet(fs, "warm") {
		*warm = "step"
	}
	warmBudget := *warm == "budget"
	if hybrid {
		for _, f := range []string{"layout", "preempt", "admit", "kv-events"} {
			if flagSet(fs, f) {
				return usageErr("--%s is the uniform cache's: the hybrid schemes (--scheme %s, model %s) have none; give --scheme uniform", f, *schemeSet, m.Name)
			}
		}
	}
	eventsOpts := kvevents.Options{Endpoint: *events, ReplayEndpoint: *eventsReplay, Topic: *eventsTopic, Rank: eventsRank}
	if flagSet(fs, "kv-events-vllm-hash-seed") {
		eventsOpts.VLLMHashSeed = eventsSeed
	}
	if *events != "" {
		if eventsOpts.Layout, err = kvevents.ParseLayout(*eventsLayout); err != nil {
			return usageErr("--kv-events-layout %s: want array or map", *eventsLayout)
		}
		for _, f := range []struct{ name, ep string }{{"kv-events", *events}, {"kv-events-replay", *eventsReplay}} {
			if f.ep == "" {
				continue
			}
			if _, err := kvevents.OffsetEndpoint(f.ep, *eventsRank); err != nil {
				return usageErr("--%s %s: %v", f.name, f.ep, err)
			}
		}
	}
	costs, err := sim.CostTable(*prices)
	if err != nil {
		return usageErr("--prices %s: want %s", *prices, strings.Join(sim.CostTableNames(), " or "))
	}
	if err := checkReport(*report); err != nil {
		return usageErr("--report %v", err)
	}
	if uint64(memory) > kvMemoryMax {
		return usageErr("--memory %s: more than the %s this cache's prefix store can reserve on the sim driver (half its %s of address space; the slots take the rest)",
			units.Bytes(uint64(memory)), units.Bytes(kvMemoryMax), units.Bytes(sim.AddressSpace))
	}
	cfg := serving.Config{Model: m, Budget: uint64(memory), MaxSeqs: *maxSeqs, BlockTokens: serving.DefaultBlockTokens}
	contextCap := cfg.ContextCap()
	if contextCap == 0 {
		block := uint64(cfg.BlockTokens) * m.TokenBytes()
		return usageErr("--memory %s: holds not one block of %d tokens of %s (%s): want at least %s",
			units.Bytes(uint64(memory)), cfg.BlockTokens, m.Name, units.Bytes(block), units.Bytes(block))
	}
	if *maxContext > contextCap {
		return usageErr("--max-context %d: --memory %s holds at most %d tokens of %s for one sequence", *maxContext, units.Bytes(uint64(memory)), contextCap, m.Name)
	}

	reqs, err := loadRequests(*trace, *limit)
	if err != nil {
		fmt.Fprintf(stderr, "vmarena kv simulate: %s: %v\n", *trace, err)
		return 1
	}
	cfg.MaxContext = *maxContext
	if cfg.MaxContext == 0 {
		cfg.MaxContext = serving.FitMaxContext(reqs, cfg)
	}
	if err := cfg.Check(); err != nil {
		return usageErr("%v", err)
	}
	opts := serving.Options{Config: cfg, MaxBatchedTokens: *maxBatched, Steps: serving.A100, Prices: costs, Record: *report != "", AdmitAhead: *admitAhead,
		WarmBudget: warmBudget}

	// The schemes, each built from the same cfg: this cache's first.
	lay, err := kvcache.ParseLayout(*layout)
	if err != nil {
		return usageErr("--layout %s: %v", *layout, err)
	}
	mode := kvcache.Drop
	if *preempt == "swap" {
		mode = kvcache.Swap
	}
	var publish func(kvcache.EventBatch)
	if *events != "" {
		pub, err := kvevents.New(eventsOpts)
		if err != nil {
			fmt.Fprintf(stderr, "vmarena kv simulate: --kv-events: %v\n", err)
			return 1
		}
		publish = pub.Publish
		fmt.Fprintf(stderr, "vmarena kv simulate: publishing KV events on %s%s\n", pub.Endpoint(), replayNote(pub))
		kvEventsHook.started(pub)
		// Deferred before the cache's Close, so run after it: its
		// AllBlocksCleared is published too.
		defer func() {
			kvEventsHook.linger(pub, *eventsLinger)
			s := pub.Stats()
			fmt.Fprintf(stderr, "vmarena kv simulate: KV events: %d batches, %d events, %s published; %d dropped at a subscriber's high-water mark, %d replay requests (%d refused)\n",
				s.Batches, s.Events, units.Bytes(uint64(s.Bytes)), s.Dropped, s.Replays, s.ReplayRefused)
			if eventsOpts.VLLMHashSeed != nil {
				fmt.Fprintf(stderr, "vmarena kv simulate: KV events: %d blocks stored under vLLM's hashes, %d merged into a vLLM block stored already, %d left out (an unknown parent)\n",
					s.Hash.Translated, s.Hash.Merged, s.Hash.Untranslated)
			}
			if err := pub.Close(); err != nil {
				fmt.Fprintf(stderr, "vmarena kv simulate: %v\n", err)
				code = max(code, 1)
			}
		}()
	}
	var cache kvCacheScheme
	var schemes []serving.Scheme
	var hybridPaged *serving.HybridBlockTable
	if hybrid {
		hc, err := serving.NewHybridCache(cfg, serving.HybridCacheOptions{PageSize: uint64(pageSize), NoMapAhead: !*mapAhead, PrefillChunk: *maxBatched})
		if err != nil {
			fmt.Fprintf(stderr, "vmarena kv simulate: %v\n", err)
			return 1
		}
		cache = hc
		if hybridPaged, err = serving.NewHybridBlockTable(cfg); err != nil {
			fmt.Fprintf(stderr, "vmarena kv simulate: %v\n", err)
			return max(1, closeCache(hc, stderr))
		}
		schemes = []serving.Scheme{hc, hybridPaged}
	} else {
		c, err := serving.NewCache(cfg, serving.CacheOptions{Layout: lay, PageSize: uint64(pageSize), Preempt: mode, ExpectOutput: *admit == "expected-output", NoMapAhead: !*mapAhead,
			Events: publish})
		if err != nil {
			fmt.Fprintf(stderr, "vmarena kv simulate: %v\n", err)
			return 1
		}
		cache = c
		paged, err := serving.NewBlockTable(cfg)
		if err != nil {
			fmt.Fprintf(stderr, "vmarena kv simulate: %v\n", err)
			return max(1, closeCache(c, stderr))
		}
		static, err := serving.NewStaticReservation(cfg)
		if err != nil {
			fmt.Fprintf(stderr, "vmarena kv simulate: %v\n", err)
			return max(1, closeCache(c, stderr))
		}
		schemes = []serving.Scheme{c, paged, static}
	}
	defer func() { code = max(code, closeCache(cache, stderr)) }()

	var results []serving.Result
	sequences := 0
	for _, r := range reqs {
		sequences += r.Sequences()
	}
	for _, sc := range schemes {
		// On a terminal a bar counts each scheme's requests done; elsewhere
		// (a log, a test) nothing is written.
		bar := progress.New(stderr, int64(sequences), "kv simulate: "+sc.Name())
		opts.Progress = nil
		if bar != nil {
			opts.Progress = func(p serving.Progress) { bar.Set(int64(p.Done)) }
		}
		res, err := serving.Simulate(reqs, sc, opts)
		if err != nil {
			bar.Close()
			fmt.Fprintf(stderr, "vmarena kv simulate: %s: %v\n", *trace, err)
			return 1
		}
		bar.Done()
		results = append(results, res)
	}

	sum := serving.SummarizeRequests(reqs)
	header := []string{
		fmt.Sprintf("vmarena kv simulate: %s, %d requests over %s (prompts %.0f tokens on average, outputs %.0f; the longest %d tokens)",
			filepath.Base(*trace), sum.Requests, seconds(sum.Span), mean(sum.PromptTokens, sum.Requests), mean(sum.OutputTokens, sum.Requests), sum.LongestContext),
		fmt.Sprintf("model %s (%s of KV a token), KV budget %s, max context %d tokens, at most %d sequences and %d tokens a step; steps priced by the %s",
			m.Name, units.Bytes(m.TokenBytes()), units.Bytes(cfg.Budget), cfg.MaxContext, cfg.MaxSeqs, *maxBatched, opts.Steps.Name),
	}
	if note := cfg.WindowNote(); note != "" && !hybrid {
		header = append(header, note)
	}
	if hybrid {
		var need []string
		for _, g := range m.Groups() {
			switch g.Kind {
			case serving.SlidingWindow:
				need = append(need, fmt.Sprintf("%d window layers' last %d tokens (%d-1+n while a chunk of n is computed)", g.Layers, g.Window, g.Window))
			case serving.Recurrent:
				need = append(need, fmt.Sprintf("%d recurrent layers' states (%s a sequence)", g.Layers, units.Bytes(g.StateBytes)))
			default:
				need = append(need, fmt.Sprintf("%d %s layers' tokens", g.Layers, g.Kind))
			}
		}
		header = append(header, fmt.Sprintf("hybrid schemes: the exact need of a sequence is its %s; %s", strings.Join(need, ", "), hybridPaged))
	}
	if sum.Blocks > 0 {
		header = append(header, fmt.Sprintf("prompt blocks (hash_ids of %d tokens): %d, %d named before by an earlier request, holding %.1f%% of prompt tokens",
			sum.BlockTokens, sum.Blocks, sum.ReusedBlocks, 100*sum.ReusedFraction()))
	} else {
		header = append(header, "prompt blocks: the trace names none, so no two requests share content")
	}
	admits := "admits with room for the prompt"
	if *admit == "expected-output" {
		admits = "admits with room for the prompt and an expected output, the mean of the requests finished so far"
	}
	if hybrid {
		header = append(header, fmt.Sprintf("this cache: %s; preempts by drop; admits with room for the prompt", cache))
	} else {
		header = append(header, fmt.Sprintf("this cache: %s, reserving %s of address space; preempts by %s; %s",
			cache, approx(cache.Reserved()), mode, admits))
	}
	ahead := "off: every page is committed on the step's path"
	if cache.MapAhead() > 0 {
		ahead = fmt.Sprintf("on: a decode's commits run during the step before, %d tokens ahead, and the page pool is warmed there", cache.MapAhead())
	}
	if *admitAhead {
		ahead += "; scheduling a step ahead (admissions, prompt chunks' reservations and frees during the step before)"
	}
	if cache.MapAhead() > 0 || *admitAhead {
		if *warm == "budget" {
			ahead += "; the page pool warmed before serving with the budget, or every token of the trace if less (--warm budget)"
		} else {
			ahead += "; the page pool warmed before serving with a step's tokens, the rest during steps and idle gaps (--warm step)"
		}
	}
	header = append(header, fmt.Sprintf("driver calls priced by the %s; this cache's mapping ahead %s", costs.Name, ahead))
	table := kvTable(results)
	if hybrid {
		table = kvNeedRow(table, results)
	}
	if *jsonOut {
		doc := kvDocument(filepath.Base(*trace), sum, cfg, *maxBatched, opts.Steps.Name, cache, *preempt, *admit, results)
		doc.DriverPricedBy, doc.MapAheadTokens, doc.Warm = costs.Name, cache.MapAhead(), *warm
		if err := writeJSON(stdout, doc); err != nil {
			fmt.Fprintf(stderr, "vmarena kv simulate: %v\n", err)
			return 1
		}
	} else {
		fmt.Fprintf(stdout, "%s\n\n", strings.Join(header, "\n"))
		printTable(stdout, table)
	}
	if *report != "" {
		if err := writeReport(*report, kvReport(header, results, table)); err != nil {
			fmt.Fprintf(stderr, "vmarena kv simulate: %v\n", err)
			return 1
		}
	}
	return 0
}

// kvEventsHook is what kv simulate does with its KV event publisher once
// it listens (nothing) and after the run (hold the sockets open for the
// linger); a test replaces both, to subscribe before the run and take
// the events before the sockets close.
var kvEventsHook = struct {
	started func(*kvevents.Publisher)
	linger  func(*kvevents.Publisher, time.Duration)
}{func(*kvevents.Publisher) {}, func(_ *kvevents.Publisher, d time.Duration) { time.Sleep(d) }}

// replayNote names the replay socket's address, if there is one.
func replayNote(p *kvevents.Publisher) string {
	if ep := p.ReplayEndpoint(); ep != "" {
		return ", replay requests on " + ep
	}
	return ""
}

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// kvTable is the table vmarena kv simulate prints (and its report
// shows): one column per scheme, one row per figure, the first row naming
// the schemes.
func kvTable(results []serving.Result) [][]string {
	var table [][]string
	row := func(label string, cell func(r serving.Result) string) {
		cells := []string{label}
		for _, r := range results {
			cells = append(cells, cell(r))
		}
		table = append(table, cells)
	}
	row("scheme", func(r serving.Result) string { return r.Scheme })
	row("requests finished", func(r serving.Result) string { return fmt.Sprintf("%d of %d", r.Finished, r.Requests) })
	if slices.ContainsFunc(results, func(r serving.Result) bool { return r.Samples > 0 }) {
		row("samples beyond one a request", func(r serving.Result) string { return fmt.Sprint(r.Samples) })
		row("samples forked / queued as requests", func(r serving.Result) string {
			if r.Forks+r.FailedForks == 0 {
				return "- (requests of one prompt)"
			}
			return fmt.Sprintf("%d / %d", r.Forks, r.FailedForks)
		})
	}
	row("refused (longer than max context)", func(r serving.Result) string { return fmt.Sprint(r.Refused) })
	row("peak concurrent sequences", func(r serving.Result) string { return fmt.Sprint(r.PeakSeqs) })
	row("mean concurrent sequences", func(r serving.Result) string { return fmt.Sprintf("%.1f", r.MeanSeqs) })
	row("KV in use by running sequences, peak", func(r serving.Result) string { return approx(r.PeakInUse) })
	row("KV in use by running sequences, mean", func(r serving.Result) string { return approx(uint64(r.MeanInUse)) })
	row("KV waste, mean (of in use)", func(r serving.Result) string {
		return fmt.Sprintf("%s (%.2f%%)", approx(uint64(r.MeanWaste)), 100*r.WasteFraction())
	})
	row("KV waste, peak", func(r serving.Result) string { return approx(r.PeakWaste) })
	row("KV cached for reuse, mean / peak", func(r serving.Result) string {
		return approx(uint64(r.MeanCached)) + " / " + approx(r.PeakCached)
	})
	row("saved by prefix sharing, mean / peak", func(r serving.Result) string {
		return approx(uint64(r.MeanSaved)) + " / " + approx(r.PeakSaved)
	})
	row("prefix cache: tokens found / looked up", func(r serving.Result) string {
		if r.Stats.PrefixQueried == 0 {
			return "—"
		}
		return fmt.Sprintf("%d / %d (%.1f%%)", r.Stats.PrefixHit, r.Stats.PrefixQueried, 100*r.PrefixHitFraction())
	})
	row("cached blocks evicted", func(r serving.Result) string { return fmt.Sprint(r.Stats.Evictions) })
	row("preemptions", func(r serving.Result) string { return fmt.Sprint(r.Preemptions) })
	row("commit calls (per second)", func(r serving.Result) string {
		return fmt.Sprintf("%d (%.1f/s)", r.Stats.Commits, r.CommitsPerSecond())
	})
	row("failed admits / resumes (CanAdmit agreed, then no room)", func(r serving.Result) string {
		return fmt.Sprintf("%d / %d", r.FailedAdmits, r.FailedResumes)
	})
	driver := func(cell func(r serving.Result) string) func(r serving.Result) string {
		return func(r serving.Result) string {
			if !r.Driver.Counted {
				return "none while serving"
			}
			return cell(r)
		}
	}
	row("driver calls: create / release / map / unmap / set access", driver(func(r serving.Result) string {
		c := r.Driver.Calls
		return fmt.Sprintf("%d / %d / %d / %d / %d", c.Create, c.Release, c.Map, c.Unmap, c.SetAccess)
	}))
	row("driver time, all / in the background (mapping ahead) / before serving", driver(func(r serving.Result) string {
		return seconds(r.Driver.Time) + " / " + seconds(r.Driver.Background) + " / " + seconds(r.Driver.Startup)
	}))
	row("driver time steps waited for (of GPU time)", driver(func(r serving.Result) string {
		return fmt.Sprintf("%s (%.3f%%)", seconds(r.Driver.Exposed), 100*r.ExposedShare())
	}))
	row("driver time per admission (of its prefill)", driver(func(r serving.Result) string {
		return fmt.Sprintf("%.3f ms (%.3f%%)", 1e3*r.AdmissionDriverTime().Seconds(), 100*r.AdmissionShare())
	}))
	paged := slices.IndexFunc(results, func(r serving.Result) bool {
		return r.Scheme == serving.PagedName || r.Scheme == serving.HybridPagedName
	})
	row("the scheme's own CPU time (thread clock), ÷ paged", func(r serving.Result) string {
		if paged < 0 || results[paged].CPUTime <= 0 {
			return seconds(r.CPUTime)
		}
		return fmt.Sprintf("%s (%.2f×)", seconds(r.CPUTime), r.CPUTime.Seconds()/results[paged].CPUTime.Seconds())
	})
	row("time to first token, mean", func(r serving.Result) string { return seconds(r.MeanTTFT) })
	row("time to first token, median / p99", func(r serving.Result) string {
		return seconds(r.MedianTTFT) + " / " + seconds(r.P99TTFT)
	})
	row("output tokens per second", func(r serving.Result) string { return fmt.Sprintf("%.0f", r.OutputPerSecond()) })
	row("tokens computed (prompts, recomputes, decodes)", func(r serving.Result) string { return fmt.Sprint(r.ComputedTokens) })
	row("steps", func(r serving.Result) string { return fmt.Sprint(r.Steps) })
	row("GPU time of the steps", func(r serving.Result) string { return seconds(r.GPUTime) })
	row("simulated time", func(r serving.Result) string { return seconds(r.SimTime) })
	row("simulation wall time", func(r serving.Result) string { return seconds(r.WallTime) })
	return table
}

// kvNeedRow adds to table, after the waste's rows, the KV in use over
// the exact need, time-averaged: what the hybrid schemes' Stored is.
func kvNeedRow(table [][]string, results []serving.Result) [][]string {
	cells := []string{"KV in use ÷ exact need, mean"}
	for _, r := range results {
		need := r.MeanInUse - r.MeanWaste
		if need <= 0 {
			cells = append(cells, "—")
			continue
		}
		cells = append(cells, fmt.Sprintf("%.4f×", r.MeanInUse/need))
	}
	at := slices.IndexFunc(table, func(row []string) bool { return row[0] == "KV waste, peak" }) + 1
	return slices.Insert(table, at, cells)
}

// closeCache closes this cache's scheme: 1 (and the error on stderr)
// if that fails, 0 else.
func closeCache(c kvCacheScheme, stderr io.Writer) int {
	if err := c.Close(); err != nil {
		fmt.Fprintf(stderr, "vmarena kv simulate: %v\n", err)
		return 1
	}
	return 0
}

// seconds formats d in seconds to three decimals.
func seconds(d time.Duration) string { return fmt.Sprintf("%.3f s", d.Seconds()) }

func mean(sum int64, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(sum) / float64(n)
}

// kvNoSimulate answers `vmarena kv` with no subcommand, or another than
// simulate: its usage for --help, a usage error else.
func kvNoSimulate(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return usageError(stderr, "kv", "no subcommand, want simulate")
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help" {
		fmt.Fprint(stdout, kvUsage)
		return 0
	}
	return usageError(stderr, "kv", "unknown subcommand %q, want simulate", args[0])
}
