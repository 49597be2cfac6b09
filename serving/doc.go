// Package serving simulates LLM serving over a KV cache: it reads request
// traces (Azure's and BurstGPT's CSV, Mooncake's and Qwen-Bailian's JSON
// lines, requests.go) or generates them from a seed (requestgen.go), and
// serves them with continuous batching (Simulate, simulate.go), holding
// the KV memory through a Scheme (kvscheme.go): vmarena's KV cache on the
// sim driver (Cache), and the paged and static baselines (BlockTable,
// StaticReservation), bookkeeping alone with no memory behind them. The
// model it serves (kvmodel.go) is a preset or read from a Hugging Face
// config.json (hfconfig.go): its KV a token, its parameters for the price
// of a step.
//
// It owns the request formats, the model configs and the simulation,
// nothing else: it never touches memory (the sim driver has none), and a
// malformed trace or config is an error naming its line or field, never a
// panic. Every reader bounds what it reads and builds from it (input.go)
// and opens regular files only; a malformed trace is an ErrMalformed
// error (the same value as replay.ErrMalformed). For a scheme on the sim
// driver it also counts and prices the driver calls of each of the
// scheme's calls, splits them into the time steps wait for and the time
// mapping ahead hides behind a step (simcost.go, DriverCost), and charges
// each scheme the thread CPU time of its own calls.
package serving
