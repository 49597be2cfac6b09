package serving

// Recording for reports: what a simulation's scheme held at each step
// (Options.Record). Off, it costs a nil check a step.

import "github.com/vmarena/vmarena/internal/series"

// RecordPoints is the most points a recorded series keeps: long runs are
// thinned, each stretch keeping its highest and lowest sample, so peaks
// survive (package internal/series).
const RecordPoints = 2000

// Series is a recorded series: Y[i] at X[i], X never decreasing.
type Series = series.Series

// Timeline is what a scheme held over a simulation, X in simulated
// seconds: each point is the state from then to the next point, the last
// the state at the end.
type Timeline struct {
	// Seqs is the sequences running (holding KV).
	Seqs Series
	// InUse is the scheme's KV memory in use by running sequences
	// (Stats.InUse) and Waste the part of it holding no token, in bytes.
	InUse, Waste Series
}

// recorder records a simulation's steps.
type recorder struct {
	seqs, inUse, waste *series.Thinned
}

func newRecorder() *recorder {
	return &recorder{seqs: series.New(RecordPoints), inUse: series.New(RecordPoints), waste: series.New(RecordPoints)}
}

func (r *recorder) add(now float64, running int, st Stats) {
	r.seqs.Add(now, float64(running))
	r.inUse.Add(now, float64(st.InUse))
	r.waste.Add(now, float64(st.Waste()))
}

func (r *recorder) timeline() *Timeline {
	return &Timeline{Seqs: r.seqs.Series(), InUse: r.inUse.Series(), Waste: r.waste.Series()}
}
