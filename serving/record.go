package serving

// Recording for reports: what a simulation's scheme held at each step
// (SimOptions.Record). Off, it costs a nil check a step.

import "github.com/vmarena/vmarena/internal/series"

// RecordPoints is the most points a recorded series keeps: long runs are
// thinned, each stretch keeping its highest and lowest sample, so peaks
// survive (package internal/series).
const RecordPoints = 2000

// Series is a recorded series: Y[i] at X[i], X never decreasing.
type Series = series.Series

// SimTimeline is what a scheme held over a simulation, X in simulated
// seconds: each point is the state from then to the next point, the last
// the state at the end.
type SimTimeline struct {
	// Seqs is the sequences running (holding KV).
	Seqs Series
	// InUse is the scheme's KV memory in use by running sequences
	// (KVStats.InUse) and Waste the part of it holding no token, in bytes.
	InUse, Waste Series
}

// simRecorder records a simulation's steps.
type simRecorder struct {
	seqs, inUse, waste *series.Thinned
}

func newSimRecorder() *simRecorder {
	return &simRecorder{seqs: series.New(RecordPoints), inUse: series.New(RecordPoints), waste: series.New(RecordPoints)}
}

func (r *simRecorder) add(now float64, running int, st KVStats) {
	r.seqs.Add(now, float64(running))
	r.inUse.Add(now, float64(st.InUse))
	r.waste.Add(now, float64(st.Waste()))
}

func (r *simRecorder) timeline() *SimTimeline {
	return &SimTimeline{Seqs: r.seqs.Series(), InUse: r.inUse.Series(), Waste: r.waste.Series()}
}
