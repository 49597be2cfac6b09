package serving

// Generated request traces: serving workloads drawn from a seed, for the
// shapes no bundled trace has — long shared prefixes, bursts, a budget
// squeezed by long outputs.

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// RequestShapes names the shapes RequestTrace generates:
//
//   - shared-prefix: 16 documents (system prompts, retrieved files) of 8
//     to 64 blocks (4,096 to 32,768 tokens, log-uniform), each request
//     one of them (Zipf's law, s = 1.2: a few are most of the traffic)
//     and a question of its own of 64 to 4,096 tokens; outputs of 16 to
//     1,024 tokens; Poisson arrivals, 2 a second.
//   - bursts: bursts of 16 to 128 requests (log-uniform) arriving within
//     200 ms, 2 requests a second on average (a burst every 36 s or so,
//     Poisson); prompts of 128 to 8,192 tokens, outputs of 16 to 2,048;
//     no content shared.
//   - squeeze: long outputs that outgrow the budget: prompts of 1,024 to
//     16,384 tokens, half of them behind one of 4 shared 2,048-token
//     prefixes, outputs of 512 to 4,096 tokens; Poisson arrivals, 4 a
//     second.
//   - parallel-sampling: requests of n samples (Request.N: half of them
//     1, the rest 2, 4 or 8, as parallel sampling and best-of-n ask),
//     prompts of 256 to 8,192 tokens shared by no other request, outputs
//     of 64 to 1,024 tokens; Poisson arrivals, 1 a second.
//
// Lengths are log-uniform between their bounds. A prompt's blocks of
// BlockTokens are named as a Mooncake trace names them (Request.Blocks):
// a shared prefix's whole blocks by its own ids, every other block by an
// id no other request has; bursts name none.
var RequestShapes = []string{"shared-prefix", "bursts", "squeeze", "parallel-sampling"}

// The requests RequestTrace makes by default, and at most.
const (
	DefaultGeneratedRequests = 1000
	MaxGeneratedRequests     = 1_000_000
)

// maxGeneratedRate bounds RequestTrace.Rate: a million requests a second.
const maxGeneratedRate = 1e6

// RequestTrace is a generated request trace: the same fields give the same
// requests.
type RequestTrace struct {
	// Shape is one of RequestShapes.
	Shape string
	// Seed draws the requests.
	Seed uint64
	// Requests is how many (0: DefaultGeneratedRequests), at most
	// MaxGeneratedRequests.
	Requests int
	// Rate is the mean arrivals a second (0: the shape's), at most a
	// million.
	Rate float64
}

// shapeRates are each shape's default Rate.
var shapeRates = map[string]float64{"shared-prefix": 2, "bursts": 2, "squeeze": 4, "parallel-sampling": 1}

// Check refuses what Generate cannot make, with driver.ErrInvalid and a
// message that says what would do: an unknown shape, a number of
// requests or a rate out of range.
func (g RequestTrace) Check() error {
	invalid := func(format string, args ...any) error {
		return errors.Wrapf(driver.ErrInvalid, "serving: generated requests: "+format, args...)
	}
	switch {
	case !slices.Contains(RequestShapes, g.Shape):
		return invalid("unknown shape %q, want %s", g.Shape, strings.Join(RequestShapes, ", "))
	case g.Requests < 0 || g.Requests > MaxGeneratedRequests:
		return invalid("%d requests: want 1 to %d (0 for the default %d)", g.Requests, MaxGeneratedRequests, DefaultGeneratedRequests)
	case !(g.Rate >= 0) || g.Rate > maxGeneratedRate:
		return invalid("a rate of %v requests a second: want more than 0 and at most %v (0 for the shape's)", g.Rate, maxGeneratedRate)
	}
	return nil
}

// Generate makes the requests, in arrival order from 0, or returns Check's
// error.
func (g RequestTrace) Generate() ([]Request, error) {
	if err := g.Check(); err != nil {
		return nil, err
	}
	if g.Requests == 0 {
		g.Requests = DefaultGeneratedRequests
	}
	if g.Rate == 0 {
		g.Rate = shapeRates[g.Shape]
	}
	gen := &requestGen{rng: rand.New(rand.NewPCG(g.Seed, 0x7265717565737473)), nextID: 1 << 40} // "requests"
	reqs := make([]Request, 0, g.Requests)
	switch g.Shape {
	case "shared-prefix":
		docs := gen.prefixes(16, 8, 64)
		zipf := rand.NewZipf(gen.rng, 1.2, 1, uint64(len(docs)-1))
		for range g.Requests {
			doc := docs[zipf.Uint64()]
			reqs = append(reqs, gen.request(gen.poisson(g.Rate), doc, int(gen.log(64, 4096)), int(gen.log(16, 1024))))
		}
	case "bursts":
		// Bursts of 16 to 128, log-uniform: their mean, (128-16)/ln 8.
		mean := 112 / math.Log(8)
		for len(reqs) < g.Requests {
			gen.now += gen.poisson(g.Rate / mean)
			start := gen.now
			n := min(int(gen.log(16, 128)), g.Requests-len(reqs))
			offsets := make([]time.Duration, n)
			for i := range offsets {
				offsets[i] = time.Duration(gen.rng.Int64N(int64(200 * time.Millisecond)))
			}
			slices.Sort(offsets)
			for _, off := range offsets {
				gen.now = start + off
				reqs = append(reqs, Request{Arrival: gen.now, Input: int(gen.log(128, 8192)), Output: int(gen.log(16, 2048))})
			}
			gen.now = start + 200*time.Millisecond
		}
	case "squeeze":
		docs := gen.prefixes(4, 4, 4)
		for range g.Requests {
			var doc []int64
			if gen.rng.IntN(2) == 0 {
				doc = docs[gen.rng.IntN(len(docs))]
			}
			input := int(gen.log(1024, 16384))
			suffix := max(input-len(doc)*BlockTokens, 1)
			reqs = append(reqs, gen.request(gen.poisson(g.Rate), doc, suffix, int(gen.log(512, 4096))))
		}
	case "parallel-sampling":
		for range g.Requests {
			r := gen.request(gen.poisson(g.Rate), nil, int(gen.log(256, 8192)), int(gen.log(64, 1024)))
			if r.N = 1; gen.rng.IntN(2) == 1 {
				r.N = 2 << gen.rng.IntN(3)
			}
			reqs = append(reqs, r)
		}
	}
	// Arrivals from 0, as the readers give them.
	first := reqs[0].Arrival
	for i := range reqs {
		reqs[i].Arrival -= first
	}
	return reqs, nil
}

// requestGen is Generate's state: the random source, the clock and the
// next block id no request has named.
type requestGen struct {
	rng    *rand.Rand
	now    time.Duration
	nextID int64
}

// log draws from [lo, hi], log-uniform.
func (g *requestGen) log(lo, hi uint64) uint64 { return logUniform(g.rng, lo, hi) }

// poisson is the gap to the next arrival of a Poisson process of rate a
// second.
func (g *requestGen) poisson(rate float64) time.Duration {
	return time.Duration(g.rng.ExpFloat64() / rate * float64(time.Second))
}

// prefixes makes n shared prefixes of lo to hi whole blocks, each its
// blocks' ids.
func (g *requestGen) prefixes(n int, lo, hi uint64) [][]int64 {
	docs := make([][]int64, n)
	for i := range docs {
		docs[i] = make([]int64, g.log(lo, hi))
		for j := range docs[i] {
			docs[i][j] = g.fresh()
		}
	}
	return docs
}

func (g *requestGen) fresh() int64 {
	g.nextID++
	return g.nextID
}

// request is a request arriving gap after the last: the prefix's blocks,
// then suffix tokens of its own, and output tokens.
func (g *requestGen) request(gap time.Duration, prefix []int64, suffix, output int) Request {
	g.now += gap
	input := len(prefix)*BlockTokens + suffix
	blocks := slices.Clip(slices.Clone(prefix))
	for len(blocks)*BlockTokens < input {
		blocks = append(blocks, g.fresh())
	}
	return Request{Arrival: g.now, Input: input, Output: output, Blocks: blocks}
}
