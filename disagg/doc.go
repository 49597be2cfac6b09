// Package disagg splits LLM serving in two, as Mooncake, DistServe and
// vLLM's disaggregated prefill do: a prefill side computes a prompt's keys
// and values into its own KV cache, and a decode side, with a cache of its
// own, takes from it only the units its prefix store does not hold, then
// generates. Each side is a kvcache.Cache (of the same shape: Layers,
// KVHeads, HeadDim, DType, PageSize, Layout) and a model; what moves
// between them is whole cache units (kvcache.Seq.UnitBytes), extent by
// extent, through a transport.
//
// # The flow of one request
//
//  1. Prefill.Prefill admits the prompt, computes with the model the
//     positions its cache does not match, marks them written, and picks
//     the first token (greedy). It holds the sequence and hands back a
//     Handoff: the request's id, prompt, first token and the shape of
//     its cache.
//  2. Decode.Decode admits the same prompt in its own cache: whole units
//     its prefix store has (the units all of whose tokens are matched,
//     Seq.Matched) are there already. It asks the prefill side (Source)
//     for the refs of the other units, [cached, units), and has its
//     Fetcher copy each extent into its own unit's extent
//     (kvcache.Seq.UnitBytes), then tells the prefill side it is done
//     (Source.Release: the registrations go, the prefill sequence is
//     freed and its prompt units stay cached there), marks the prompt
//     written and decodes.
//
// The tokens are those of one process doing both: the units moved hold
// the same bytes the decode side would have computed, and the model is
// deterministic (the tests compare with a plain run of the reference
// transformer, tokens and logits bit for bit).
//
// # The transport
//
// Two small interfaces, one per side, stand for a transfer engine:
// Exporter on the prefill side makes an extent's tensor readable from the
// decode side and names it by a Ref; Fetcher on the decode side copies
// extents named by Refs into its own tensors. Local is both, in one
// process: its refs index a table, a fetch is tensor.Copy — the oracle
// the engine is compared with. A transfer engine (package transfer)
// fits through a few lines: Export is Engine.Register of the tensor and
// the registration's Descriptor, marshalled, as the Ref (its Close is the
// release); Fetch registers each destination tensor and issues one
// Peer.Get with an Op per extent (the Ref unmarshalled as the remote
// Descriptor), then closes the destinations' registrations: EngineExporter
// and EngineFetcher do it, and its test runs both sides over two tcp engines.
// A Source is
// the prefill side as the decode side reaches it: Prefill itself in one
// process, any request/reply channel between two (Refs are plain bytes).
// Prefill names a request by 64 random bits, so a decode peer reaches the
// requests whose handoffs it was given and cannot guess another's.
//
// # Device memory
//
// On the CUDA and AscendCL drivers a cache's units are device tensors
// (kvcache.Seq.UnitBytes): transfer engines made with staging
// (transfer.Config.Staging, on each cache's device) move them through a
// pinned host buffer; Local, whose tensor.Copy needs host memory, refuses
// them (ErrUnsupported). A model that computes on the host — the
// reference transformer — reaches the rows through the driver's copies:
// a stream and a pinned buffer made per request at its first device row
// and ended with it; Store copies a position's row to the device, and the
// first Load of a layer after an Append copies the layer's rows off it
// (a Store after that updates the copy too). A GPU model's kernels would
// read and write the rows in place.
//
// # Lifetimes
//
// An exported extent is a tensor over the prefill sequence's memory under
// that sequence's lease (kvcache's Lifetimes): if the prefill side frees
// or preempts the sequence — or closes its cache — while a fetch runs,
// the revoke waits for the copy in flight, and a fetch after it fails
// with ErrClosed; it never reads memory given back. The decode side's
// destination extents are its own sequence's units, writable (the units
// it matched are not fetched, and they alone are read-only).
//
// # What it never does
//
// It never moves a unit the decode side holds already, never writes a
// unit shared through the decode side's prefix store, never keeps a
// prefill sequence past its Release (or Close), and never closes the
// caches, model or transport it is given: their owner does.
//
// # Errors
//
// Every refusal is marked with a sentinel of the driver package, its
// message starting "disagg: ": ErrInvalid for a bad argument (a request
// id the prefill side does not hold, a unit range outside the prompt's,
// caches of different shapes, refs and tensors of different lengths, a
// handoff's token outside the model's vocabulary),
// ErrClosed for a closed side or a released extent; the caches' and the
// transport's errors come back wrapped as they are.
package disagg
