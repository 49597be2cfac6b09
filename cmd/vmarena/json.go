package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/vmarena/vmarena/driver/acl"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/replay"
	"github.com/vmarena/vmarena/serving"
)

// With --json, devices, replay, kv simulate and demo print one JSON
// document on stdout instead of their text: the types below are its
// schema, one a command, their doc comments the fields' meaning. Field
// names are snake_case and stay as they are; sizes are in bytes (fields
// ending _bytes), times in seconds (fields ending _seconds, as floats),
// counts are integers, ratios plain numbers; no figure is a formatted
// string. A figure that does not apply is null (or left out, where the
// comment says so), never a placeholder such as "n/a".

// writeJSON writes doc as an indented JSON document and a newline.
func writeJSON(w io.Writer, doc any) error {
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(data, '\n'))
	return err
}

// secs is d in seconds.
func secs(d time.Duration) float64 { return d.Seconds() }

// ---- vmarena devices --json ----

// DevicesJSON is what vmarena devices --json prints: a section per
// driver.
type DevicesJSON struct {
	Host DriverDevicesJSON `json:"host"`
	Sim  DriverDevicesJSON `json:"sim"`
	CUDA DriverDevicesJSON `json:"cuda"`
	ACL  DriverDevicesJSON `json:"acl"`
}

// DriverDevicesJSON is one driver's section.
type DriverDevicesJSON struct {
	// Available says the driver can run here; Error says why not when it
	// cannot (left out when it can).
	Available bool   `json:"available"`
	Error     string `json:"error,omitempty"`
	// Library is the vendor library loaded (cuda and acl only).
	Library string `json:"library,omitempty"`
	// DriverVersion is the CUDA driver's version, "12.6" (cuda only;
	// "unknown" when it does not say).
	DriverVersion string `json:"driver_version,omitempty"`
	// Devices are the devices the driver sees (with no options, for host
	// and sim).
	Devices []DeviceJSON `json:"devices"`
	// Missing names the symbol groups the vendor library lacks (cuda and
	// acl only).
	Missing []string `json:"missing,omitempty"`
}

// DeviceJSON is one device.
type DeviceJSON struct {
	// ID is the device's number: the driver's device ID (host, sim), the
	// CUDA ordinal, or the ACL device ID.
	ID int `json:"id"`
	// Name is the device's name (cuda and acl only).
	Name string `json:"name,omitempty"`
	// CapacityBytes is the device's memory.
	CapacityBytes uint64 `json:"capacity_bytes"`
	// FreeBytes is the memory free now (acl only).
	FreeBytes *uint64 `json:"free_bytes,omitempty"`
	// MinGranularityBytes and RecommendedGranularityBytes are the
	// device's granularities; 0 when a device without virtual memory
	// management does not say.
	MinGranularityBytes         uint64 `json:"min_granularity_bytes"`
	RecommendedGranularityBytes uint64 `json:"recommended_granularity_bytes"`
	// NUMANode is the host device's NUMA node (host only; left out when
	// unknown).
	NUMANode *int `json:"numa_node,omitempty"`
	// VMM, POSIXFD and Pools say whether a CUDA device has virtual memory
	// management, POSIX file descriptor export and memory pools (cuda
	// only).
	VMM     *bool `json:"vmm,omitempty"`
	POSIXFD *bool `json:"posix_fd,omitempty"`
	Pools   *bool `json:"pools,omitempty"`
}

// devicesDocument probes each driver as vmarena devices does.
func devicesDocument(cudaLib, aclLib string) DevicesJSON {
	fail := func(s *DriverDevicesJSON, err error) {
		s.Available, s.Error, s.Devices = false, err.Error(), []DeviceJSON{}
	}
	var doc DevicesJSON
	doc.Host = DriverDevicesJSON{Available: true, Devices: []DeviceJSON{}}
	if drv, err := host.New(host.Options{}); err != nil {
		fail(&doc.Host, err)
	} else {
		for _, d := range drv.Devices() {
			dev := DeviceJSON{ID: int(d.ID), CapacityBytes: d.Capacity,
				MinGranularityBytes: d.MinGranularity, RecommendedGranularityBytes: d.RecommendedGranularity}
			if d.NUMANode >= 0 {
				dev.NUMANode = &d.NUMANode
			}
			doc.Host.Devices = append(doc.Host.Devices, dev)
		}
		if err := drv.Close(); err != nil {
			fail(&doc.Host, err)
		}
	}
	doc.Sim = DriverDevicesJSON{Available: true, Devices: []DeviceJSON{}}
	if drv, err := sim.New(sim.Options{}); err != nil {
		fail(&doc.Sim, err)
	} else {
		for _, d := range drv.Devices() {
			doc.Sim.Devices = append(doc.Sim.Devices, DeviceJSON{ID: int(d.ID), CapacityBytes: d.Capacity,
				MinGranularityBytes: d.MinGranularity, RecommendedGranularityBytes: d.RecommendedGranularity})
		}
		if err := drv.Close(); err != nil {
			fail(&doc.Sim, err)
		}
	}
	if rep, err := cuda.Probe(cudaLib); err != nil {
		fail(&doc.CUDA, err)
	} else {
		doc.CUDA = DriverDevicesJSON{Available: true, Library: rep.Library, DriverVersion: cudaVersion(rep.Version),
			Devices: []DeviceJSON{}, Missing: rep.Missing}
		for _, d := range rep.Devices {
			vmm, fd, pools := d.VMM, d.POSIXFD, d.Pools
			doc.CUDA.Devices = append(doc.CUDA.Devices, DeviceJSON{ID: d.Ordinal, Name: d.Name, CapacityBytes: d.Memory,
				MinGranularityBytes: d.MinGranularity, RecommendedGranularityBytes: d.RecommendedGranularity,
				VMM: &vmm, POSIXFD: &fd, Pools: &pools})
		}
	}
	if rep, err := acl.Probe(aclLib); err != nil {
		fail(&doc.ACL, err)
	} else {
		doc.ACL = DriverDevicesJSON{Available: true, Library: rep.Library, Devices: []DeviceJSON{}, Missing: rep.Missing}
		for _, d := range rep.Devices {
			free := d.Free
			doc.ACL.Devices = append(doc.ACL.Devices, DeviceJSON{ID: d.ID, Name: d.Name, CapacityBytes: d.Memory, FreeBytes: &free,
				MinGranularityBytes: d.MinGranularity, RecommendedGranularityBytes: d.RecommendedGranularity})
		}
	}
	return doc
}

// ---- vmarena replay --json ----

// ReplayJSON is what vmarena replay --json prints.
type ReplayJSON struct {
	// Driver is the driver replayed on: sim, host, cuda or acl.
	Driver string `json:"driver"`
	// DriverDevices names the devices of the largest driver opened (host,
	// cuda and acl; left out on sim).
	DriverDevices string `json:"driver_devices,omitempty"`
	// GranularityBytes is the devices' granularity and the allocator's
	// chunk size.
	GranularityBytes uint64 `json:"granularity_bytes"`
	// Policy is the allocator's size and alignment policy; Stitching
	// whether it stitches free chunks; SlackDivisor its --slack-divisor.
	Policy       string `json:"policy"`
	Stitching    bool   `json:"stitching"`
	SlackDivisor uint64 `json:"slack_divisor"`
	// PricedBy names the table of driver call costs (sim only).
	PricedBy string `json:"priced_by,omitempty"`
	// TargetRatio is the committed / allocated target, which applies at
	// TargetGranularityBytes.
	TargetRatio            float64 `json:"target_ratio"`
	TargetGranularityBytes uint64  `json:"target_granularity_bytes"`
	// Devices are the replayed devices: each device of each trace, in the
	// order the table's columns are.
	Devices []ReplayDeviceJSON `json:"devices"`
}

// ReplayDeviceJSON is one device of one trace: a column of the table.
type ReplayDeviceJSON struct {
	// Label is the column's heading; Trace the trace's name (the file's
	// less .csv, or the synthetic workload and its seed); Device the
	// device in the trace.
	Label  string `json:"label"`
	Trace  string `json:"trace"`
	Device int    `json:"device"`
	// PyTorchModelled says PyTorch's figures (peak reserved, segment
	// events, its driver calls and oom events) are a model's of its
	// caching allocator run on the same events, as for a synthetic
	// workload, not a trace's own.
	PyTorchModelled bool `json:"pytorch_modelled"`
	// Stopped says an error stopped the trace's replay: the figures are
	// those of the events replayed before it (the command exits 1).
	Stopped bool `json:"stopped"`
	// CapacityBytes is what the device's allocator could commit.
	CapacityBytes uint64 `json:"capacity_bytes"`
	// Events counts the trace's events on the device; Allocs and Frees
	// the allocator calls they made; SkippedFrees the frees of an
	// alloc_id not live (skipped); MismatchedFrees the frees whose address
	// or size disagree with their alloc.
	Events          int `json:"events"`
	Allocs          int `json:"allocs"`
	Frees           int `json:"frees"`
	SkippedFrees    int `json:"skipped_frees"`
	MismatchedFrees int `json:"mismatched_frees"`
	// MidRun says the trace starts mid-run: FreesBeforeRecording frees of
	// allocations made before recording, or ReservedBelowZero (segments
	// returned that were reserved before recording).
	MidRun               bool `json:"mid_run"`
	FreesBeforeRecording int  `json:"frees_before_recording"`
	ReservedBelowZero    bool `json:"reserved_below_zero"`
	// OOMs are the requests PyTorch failed, in trace order, and whether
	// vmarena served each.
	OOMs []ReplayOOMJSON `json:"ooms"`
	// PeakAllocatedBytes is the trace's peak allocated memory;
	// PeakCommittedBytes vmarena's peak committed; CommittedOverAllocated
	// their ratio (0 when nothing was allocated).
	PeakAllocatedBytes     uint64  `json:"peak_allocated_bytes"`
	PeakCommittedBytes     uint64  `json:"peak_committed_bytes"`
	CommittedOverAllocated float64 `json:"committed_over_allocated"`
	// PeakReservedBytes is PyTorch's peak reserved memory (null for a trace
	// without segment events); ReservedOverAllocated its ratio to the peak
	// allocated (null when it says nothing: no segment events, or mid-run).
	PeakReservedBytes     *uint64  `json:"peak_reserved_bytes"`
	ReservedOverAllocated *float64 `json:"reserved_over_allocated"`
	// SegmentEvents counts PyTorch's segment events; MapEvents and
	// UnmapEvents vmarena's; ChunkMaps and ChunkUnmaps its driver map and
	// unmap calls; Decommits its decommit calls, which gave back
	// DecommittedBytes; Stitches, Grows and OOMRetries what the allocator
	// did.
	SegmentEvents    int    `json:"segment_events"`
	MapEvents        int    `json:"map_events"`
	UnmapEvents      int    `json:"unmap_events"`
	ChunkMaps        int    `json:"chunk_maps"`
	ChunkUnmaps      int    `json:"chunk_unmaps"`
	Decommits        int    `json:"decommits"`
	DecommittedBytes uint64 `json:"decommitted_bytes"`
	Stitches         int    `json:"stitches"`
	Grows            int    `json:"grows"`
	OOMRetries       int    `json:"oom_retries"`
	// DriverCalls are vmarena's driver calls (null unless priced: on the
	// sim driver); PyTorchDriverCalls PyTorch's, modelled from its segment
	// events (null without segment events).
	DriverCalls        *CallsJSON `json:"driver_calls"`
	PyTorchDriverCalls *CallsJSON `json:"pytorch_driver_calls"`
	// AddressReserves and AddressFrees count vmarena's address space
	// reserves and frees over all the trace's devices (null unless
	// priced).
	AddressReserves *uint64 `json:"address_reserves"`
	AddressFrees    *uint64 `json:"address_frees"`
	// DriverSeconds and PyTorchDriverSeconds are the calls priced (null
	// unless priced; PyTorch's also null without segment events).
	DriverSeconds        *float64 `json:"driver_seconds"`
	PyTorchDriverSeconds *float64 `json:"pytorch_driver_seconds"`
	// DriverTimes are both sides' calls priced by each of
	// replay.PriceTables (A100, H100), whatever the driver.
	DriverTimes []DriverTimesJSON `json:"driver_times"`
	// The targets: "met", "not met" or "n/a" (does not apply).
	RatioTarget      string `json:"ratio_target"`
	MapEventsTarget  string `json:"map_events_target"`
	DriverTimeTarget string `json:"driver_time_target"`
	// Peak is the alloc at which the allocated memory first reached its
	// peak (null when nothing was allocated); LargestAtPeak the largest
	// allocations live then, largest first (at most
	// replay.MaxLargestAtPeak), of LiveAtPeak live.
	Peak          *PeakAllocJSON  `json:"peak"`
	LargestAtPeak []PeakAllocJSON `json:"largest_at_peak"`
	LiveAtPeak    int             `json:"live_at_peak"`
}

// PeakAllocJSON is an allocation of a trace: its alloc_id, size, the
// line and sequence number of its alloc event, and that event's time in
// seconds since the device's first timed event (null in a trace without
// times).
type PeakAllocJSON struct {
	AllocID   int64    `json:"alloc_id"`
	SizeBytes uint64   `json:"size_bytes"`
	Line      int      `json:"line"`
	Seq       uint64   `json:"seq"`
	Seconds   *float64 `json:"seconds"`
}

func peakAllocJSON(p replay.PeakAlloc, s replay.Summary) PeakAllocJSON {
	j := PeakAllocJSON{AllocID: p.AllocID, SizeBytes: p.Size, Line: p.Line, Seq: p.Seq}
	if p.HasTime && s.HasFirstTime {
		sec := float64(p.TimeUS-s.FirstTimeUS) / 1e6
		j.Seconds = &sec
	}
	return j
}

// ReplayOOMJSON is a request PyTorch failed: its oom event's line and
// sequence number, and whether vmarena served it.
type ReplayOOMJSON struct {
	Line   int    `json:"line"`
	Seq    uint64 `json:"seq"`
	Served bool   `json:"served"`
}

// DriverTimesJSON is both sides' driver calls on a device priced by one
// table (Table names it): vmarena's seconds (null unless priced: on the
// sim driver), PyTorch's (null when the trace has no segment events:
// unknown), and vmarena's over PyTorch's (null unless both are known and
// the trace does not start mid-run).
type DriverTimesJSON struct {
	Table              string   `json:"table"`
	VMArenaSeconds     *float64 `json:"vmarena_seconds"`
	PyTorchSeconds     *float64 `json:"pytorch_seconds"`
	VMArenaOverPyTorch *float64 `json:"vmarena_over_pytorch"`
}

func driverTimesJSON(d replay.DeviceResult) []DriverTimesJSON {
	out := []DriverTimesJSON{}
	for _, costs := range replay.PriceTables {
		dt := d.DriverTimesBy(costs)
		j := DriverTimesJSON{Table: costs.Name}
		if dt.Priced {
			v := secs(dt.VMArena)
			j.VMArenaSeconds = &v
		}
		if dt.PyTorchKnown {
			p := secs(dt.PyTorch)
			j.PyTorchSeconds = &p
		}
		if x, ok := dt.Ratio(); ok {
			j.VMArenaOverPyTorch = &x
		}
		out = append(out, j)
	}
	return out
}

// CallsJSON counts driver calls of each kind.
type CallsJSON struct {
	Create    uint64 `json:"create"`
	Map       uint64 `json:"map"`
	SetAccess uint64 `json:"set_access"`
	Unmap     uint64 `json:"unmap"`
	Release   uint64 `json:"release"`
}

func callsJSON(c sim.Calls) *CallsJSON {
	return &CallsJSON{Create: c.Create, Map: c.Map, SetAccess: c.SetAccess, Unmap: c.Unmap, Release: c.Release}
}

// replayDocument is the document of a replay on the driver named drv
// (devices: the largest's devices, off sim) with opts, of cols.
func replayDocument(drv, devices string, opts replay.Options, cols []column) ReplayJSON {
	doc := ReplayJSON{Driver: drv, GranularityBytes: opts.Granularity, Policy: fmt.Sprint(opts.Policy),
		Stitching: !opts.NoStitch, SlackDivisor: opts.SlackDivisor,
		TargetRatio: replay.TargetRatio, TargetGranularityBytes: replay.TargetGranularity, Devices: []ReplayDeviceJSON{}}
	if drv == "sim" {
		doc.PricedBy = sim.A100.Name
	} else {
		doc.DriverDevices = devices
	}
	for _, c := range cols {
		d, s := c.d, c.d.Summary
		j := ReplayDeviceJSON{Label: c.label, Trace: c.trace, Device: d.Device, PyTorchModelled: c.modelled, Stopped: c.stopped, LiveAtPeak: s.LiveAtPeak,
			LargestAtPeak: []PeakAllocJSON{},
			CapacityBytes: c.capacity, Events: s.Events, Allocs: d.Allocs, Frees: d.Frees, SkippedFrees: d.SkippedFrees,
			MismatchedFrees: s.MismatchedFrees, MidRun: s.MidRun(), FreesBeforeRecording: s.FreedBeforeRecording,
			ReservedBelowZero: s.ReservedBelowZero, OOMs: []ReplayOOMJSON{},
			PeakAllocatedBytes: s.PeakAllocated, PeakCommittedBytes: d.Figures.PeakCommitted, CommittedOverAllocated: d.Ratio(),
			SegmentEvents: s.SegmentEvents, MapEvents: d.Figures.MapEvents, UnmapEvents: d.Figures.UnmapEvents,
			ChunkMaps: d.Figures.ChunkMaps, ChunkUnmaps: d.Figures.ChunkUnmaps, Decommits: d.Figures.Decommits,
			DecommittedBytes: d.Figures.DecommittedBytes, Stitches: d.Figures.Stitches, Grows: d.Figures.Grows,
			OOMRetries: d.Figures.OOMRetries, RatioTarget: string(d.RatioTarget()),
			MapEventsTarget: string(d.MapEventsTarget()), DriverTimeTarget: string(d.DriverTimeTarget()),
			DriverTimes: driverTimesJSON(d)}
		for _, o := range d.OOMs {
			j.OOMs = append(j.OOMs, ReplayOOMJSON{Line: o.Line, Seq: o.Seq, Served: o.Served})
		}
		if s.SegmentEvents > 0 {
			reserved := s.PeakReserved
			j.PeakReservedBytes = &reserved
			j.PyTorchDriverCalls = callsJSON(s.SegmentCalls)
		}
		if x, ok := s.PyTorchRatio(); ok {
			j.ReservedOverAllocated = &x
		}
		if d.Priced {
			j.DriverCalls = callsJSON(d.DriverCalls)
			reserves, frees := c.space.Reserve, c.space.Unreserve
			j.AddressReserves, j.AddressFrees = &reserves, &frees
			t := secs(d.DriverTime())
			j.DriverSeconds = &t
			if s.SegmentEvents > 0 {
				pt := secs(d.PyTorchDriverTime())
				j.PyTorchDriverSeconds = &pt
			}
		}
		if s.LiveAtPeak > 0 {
			p := peakAllocJSON(s.Peak, s)
			j.Peak = &p
		}
		for _, a := range s.LargestAtPeak {
			j.LargestAtPeak = append(j.LargestAtPeak, peakAllocJSON(a, s))
		}
		doc.Devices = append(doc.Devices, j)
	}
	return doc
}

// ---- vmarena kv simulate --json ----

// KVSimulateJSON is what vmarena kv simulate --json prints.
type KVSimulateJSON struct {
	// Trace is the request trace's file name (less its directory).
	Trace string `json:"trace"`
	// Requests counts the requests served (after --limit); SpanSeconds is
	// the time from the first arrival to the last; PromptTokens and
	// OutputTokens add up the requests'; LongestContextTokens is the
	// longest prompt and output.
	Requests             int     `json:"requests"`
	SpanSeconds          float64 `json:"span_seconds"`
	PromptTokens         int64   `json:"prompt_tokens"`
	OutputTokens         int64   `json:"output_tokens"`
	LongestContextTokens int     `json:"longest_context_tokens"`
	// PromptBlocks counts the prompt blocks the trace names (Mooncake's
	// and Bailian's hash_ids, 0 for a trace that names none),
	// ReusedPromptBlocks those an earlier request named after the same
	// ones, ReusedPromptTokens the prompt tokens in them, and
	// PromptBlockTokens the tokens of a block (512 Mooncake's, 16
	// Bailian's; 0 where the trace names none).
	PromptBlocks       int   `json:"prompt_blocks"`
	ReusedPromptBlocks int   `json:"reused_prompt_blocks"`
	ReusedPromptTokens int64 `json:"reused_prompt_tokens"`
	PromptBlockTokens  int   `json:"prompt_block_tokens"`
	// Model is the model's name and TokenKVBytes its KV memory a token.
	Model        string `json:"model"`
	TokenKVBytes uint64 `json:"token_kv_bytes"`
	// BudgetBytes is the KV memory's budget; MaxContextTokens the most a
	// sequence holds; MaxSeqs and MaxBatchedTokens the scheduler's limits;
	// StepsPricedBy names the step prices.
	BudgetBytes      uint64 `json:"budget_bytes"`
	MaxContextTokens int    `json:"max_context_tokens"`
	MaxSeqs          int    `json:"max_seqs"`
	MaxBatchedTokens int    `json:"max_batched_tokens"`
	StepsPricedBy    string `json:"steps_priced_by"`
	// DriverPricedBy names the table of driver call costs (--prices);
	// MapAheadTokens is this cache's mapping-ahead window, 0 when off
	// (--map-ahead=false); Warm is --warm, what the page pool is warmed
	// with before serving: "budget" or "step".
	DriverPricedBy string `json:"driver_priced_by"`
	MapAheadTokens int    `json:"map_ahead_tokens"`
	Warm           string `json:"warm"`
	// Cache describes this cache (its layout and pages), which reserves
	// CacheReservedBytes of address space; Preempt is its --preempt and
	// Admit its --admit.
	Cache              string `json:"cache"`
	CacheReservedBytes uint64 `json:"cache_reserved_bytes"`
	Preempt            string `json:"preempt"`
	Admit              string `json:"admit"`
	// Schemes are the ways of holding KV memory, this cache first: the
	// table's columns.
	Schemes []KVSchemeJSON `json:"schemes"`
}

// KVSchemeJSON is one scheme's figures: a column of the table.
type KVSchemeJSON struct {
	Scheme string `json:"scheme"`
	// Requests, Finished and Refused (longer than the max context) count
	// sequences: a request of n samples (the trace's n) counts n, Samples
	// of them beyond one a request; Forks the samples started as forks of
	// their request's first (this cache), FailedForks those it could not
	// fork and queued as requests; Preemptions the sequences preempted.
	Requests    int `json:"requests"`
	Samples     int `json:"samples"`
	Forks       int `json:"forks"`
	FailedForks int `json:"failed_forks"`
	Finished    int `json:"finished"`
	Refused     int `json:"refused"`
	Preemptions int `json:"preemptions"`
	// PeakSeqs and MeanSeqs are the sequences running at once.
	PeakSeqs int     `json:"peak_seqs"`
	MeanSeqs float64 `json:"mean_seqs"`
	// The KV memory in use by running sequences (the table's "KV
	// committed"), the waste (in-use memory holding no token), the memory
	// cached for reuse and that saved by prefix sharing: peak and mean
	// over simulated time. WasteFraction is the mean waste over the mean
	// in use.
	PeakInUseBytes  uint64  `json:"peak_in_use_bytes"`
	MeanInUseBytes  float64 `json:"mean_in_use_bytes"`
	PeakWasteBytes  uint64  `json:"peak_waste_bytes"`
	MeanWasteBytes  float64 `json:"mean_waste_bytes"`
	WasteFraction   float64 `json:"waste_fraction"`
	PeakCachedBytes uint64  `json:"peak_cached_bytes"`
	MeanCachedBytes float64 `json:"mean_cached_bytes"`
	PeakSavedBytes  uint64  `json:"peak_saved_bytes"`
	MeanSavedBytes  float64 `json:"mean_saved_bytes"`
	// PrefixTokensLookedUp and PrefixTokensFound are the prefix cache's
	// lookups and hits, in tokens; Evictions counts cached blocks evicted.
	PrefixTokensLookedUp int64 `json:"prefix_tokens_looked_up"`
	PrefixTokensFound    int64 `json:"prefix_tokens_found"`
	Evictions            int64 `json:"evictions"`
	// Commits counts commit calls, CommitsPerSecond over simulated time.
	Commits          int64   `json:"commits"`
	CommitsPerSecond float64 `json:"commits_per_second"`
	// Time to first token: mean, median and 99th percentile.
	MeanTTFTSeconds   float64 `json:"mean_ttft_seconds"`
	MedianTTFTSeconds float64 `json:"median_ttft_seconds"`
	P99TTFTSeconds    float64 `json:"p99_ttft_seconds"`
	// OutputTokens counts the tokens output, OutputTokensPerSecond over
	// simulated time; ComputedTokens those computed (prompts, recomputes,
	// decodes); Steps the steps run.
	OutputTokens          int64   `json:"output_tokens"`
	OutputTokensPerSecond float64 `json:"output_tokens_per_second"`
	ComputedTokens        int64   `json:"computed_tokens"`
	Steps                 int     `json:"steps"`
	// SimulatedSeconds is the simulated time; WallSeconds what the
	// simulation took to run (varies from run to run).
	SimulatedSeconds float64 `json:"simulated_seconds"`
	WallSeconds      float64 `json:"wall_seconds"`
	// Admissions counts the admits and resumes that succeeded;
	// FailedAdmits and FailedResumes those the scheme's CanAdmit agreed
	// to that then found no room.
	Admissions    int `json:"admissions"`
	FailedAdmits  int `json:"failed_admits"`
	FailedResumes int `json:"failed_resumes"`
	// DriverCallsCounted says the scheme's driver calls were counted (this
	// cache, on the sim driver); the baselines allocate their pool once
	// before serving and make none while serving, all their driver
	// figures 0.
	DriverCallsCounted bool `json:"driver_calls_counted"`
	// DriverCalls counts the driver calls by kind.
	DriverCalls DriverCallsJSON `json:"driver_calls"`
	// DriverSeconds is the calls priced by driver_priced_by;
	// BackgroundDriverSeconds what of it mapping ahead ran during steps;
	// StartupDriverSeconds what of it was made before serving started
	// (the page pool warmed with a step's pages, on no step's path,
	// unless --map-ahead=false without --admit-ahead);
	// ExposedDriverSeconds what steps waited for (in simulated_seconds),
	// ExposedDriverShare that over GPUSeconds, the steps' own time.
	DriverSeconds           float64 `json:"driver_seconds"`
	BackgroundDriverSeconds float64 `json:"background_driver_seconds"`
	StartupDriverSeconds    float64 `json:"startup_driver_seconds"`
	ExposedDriverSeconds    float64 `json:"exposed_driver_seconds"`
	GPUSeconds              float64 `json:"gpu_seconds"`
	ExposedDriverShare      float64 `json:"exposed_driver_share"`
	// AdmissionDriverSeconds is the driver time of admissions (admit,
	// resume, prompt and recompute chunks, preempt, finish);
	// PrefillSeconds the time their prompts take alone on the GPU;
	// AdmissionDriverShare the one over the other.
	AdmissionDriverSeconds float64 `json:"admission_driver_seconds"`
	PrefillSeconds         float64 `json:"prefill_seconds"`
	AdmissionDriverShare   float64 `json:"admission_driver_share"`
	// CPUSeconds is the thread CPU time of the scheme's own calls (varies
	// from run to run; 0 off Linux).
	CPUSeconds float64 `json:"cpu_seconds"`
}

// DriverCallsJSON is driver calls by kind, and their total.
type DriverCallsJSON struct {
	Reserve   uint64 `json:"reserve"`
	Unreserve uint64 `json:"unreserve"`
	Create    uint64 `json:"create"`
	Release   uint64 `json:"release"`
	Map       uint64 `json:"map"`
	Unmap     uint64 `json:"unmap"`
	SetAccess uint64 `json:"set_access"`
	Total     uint64 `json:"total"`
}

func driverCallsJSON(c sim.Calls) DriverCallsJSON {
	return DriverCallsJSON{Reserve: c.Reserve, Unreserve: c.Unreserve, Create: c.Create, Release: c.Release,
		Map: c.Map, Unmap: c.Unmap, SetAccess: c.SetAccess, Total: c.Total()}
}

// kvDocument is the document of a simulation of the requests summed up
// in sum, with cfg and the step limit maxBatched, steps priced by steps,
// this cache being cache (preempting as preempt, admitting as admit).
func kvDocument(trace string, sum serving.RequestsSummary, cfg serving.Config, maxBatched int, steps string,
	cache interface {
		String() string
		Reserved() uint64
	}, preempt, admit string, results []serving.Result) KVSimulateJSON {
	return KVSimulateJSON{Trace: trace, Requests: sum.Requests, SpanSeconds: secs(sum.Span),
		PromptTokens: sum.PromptTokens, OutputTokens: sum.OutputTokens, LongestContextTokens: sum.LongestContext,
		PromptBlocks: sum.Blocks, ReusedPromptBlocks: sum.ReusedBlocks, ReusedPromptTokens: sum.ReusedTokens, PromptBlockTokens: sum.BlockTokens,
		Model: cfg.Model.Name, TokenKVBytes: cfg.Model.TokenBytes(), BudgetBytes: cfg.Budget, MaxContextTokens: cfg.MaxContext,
		MaxSeqs: cfg.MaxSeqs, MaxBatchedTokens: maxBatched, StepsPricedBy: steps,
		Cache: cache.String(), CacheReservedBytes: cache.Reserved(), Preempt: preempt, Admit: admit,
		Schemes: kvSchemesJSON(results)}
}

func kvSchemesJSON(results []serving.Result) []KVSchemeJSON {
	out := []KVSchemeJSON{}
	for _, r := range results {
		out = append(out, KVSchemeJSON{Scheme: r.Scheme, Requests: r.Requests, Samples: r.Samples, Forks: r.Forks, FailedForks: r.FailedForks,
			Finished: r.Finished, Refused: r.Refused,
			Preemptions: r.Preemptions, PeakSeqs: r.PeakSeqs, MeanSeqs: r.MeanSeqs,
			PeakInUseBytes: r.PeakInUse, MeanInUseBytes: r.MeanInUse,
			PeakWasteBytes: r.PeakWaste, MeanWasteBytes: r.MeanWaste, WasteFraction: r.WasteFraction(),
			PeakCachedBytes: r.PeakCached, MeanCachedBytes: r.MeanCached, PeakSavedBytes: r.PeakSaved, MeanSavedBytes: r.MeanSaved,
			PrefixTokensLookedUp: r.Stats.PrefixQueried, PrefixTokensFound: r.Stats.PrefixHit, Evictions: r.Stats.Evictions,
			Commits: r.Stats.Commits, CommitsPerSecond: r.CommitsPerSecond(),
			MeanTTFTSeconds: secs(r.MeanTTFT), MedianTTFTSeconds: secs(r.MedianTTFT), P99TTFTSeconds: secs(r.P99TTFT),
			OutputTokens: r.OutputTokens, OutputTokensPerSecond: r.OutputPerSecond(), ComputedTokens: r.ComputedTokens,
			Steps: r.Steps, SimulatedSeconds: secs(r.SimTime), WallSeconds: secs(r.WallTime),
			Admissions: r.Admissions, FailedAdmits: r.FailedAdmits, FailedResumes: r.FailedResumes,
			DriverCallsCounted: r.Driver.Counted, DriverCalls: driverCallsJSON(r.Driver.Calls),
			DriverSeconds: secs(r.Driver.Time), BackgroundDriverSeconds: secs(r.Driver.Background), StartupDriverSeconds: secs(r.Driver.Startup),
			ExposedDriverSeconds: secs(r.Driver.Exposed), GPUSeconds: secs(r.GPUTime), ExposedDriverShare: r.ExposedShare(),
			AdmissionDriverSeconds: secs(r.Driver.Admission), PrefillSeconds: secs(r.PrefillTime), AdmissionDriverShare: r.AdmissionShare(),
			CPUSeconds: secs(r.CPUTime)})
	}
	return out
}

// ---- vmarena demo --json ----

// DemoJSON is what vmarena demo --json prints.
type DemoJSON struct {
	// Driver is the driver the demo ran on; Header the line it printed
	// first; GranularityBytes the driver's granularity; Devices the
	// devices' memory at the end.
	Driver           string `json:"driver"`
	Header           string `json:"header"`
	GranularityBytes uint64 `json:"granularity_bytes"`
	// Steps are the numbered steps, in order.
	Steps []DemoStepJSON `json:"steps"`
}

// DemoStepJSON is one numbered step.
type DemoStepJSON struct {
	Step  int    `json:"step"`
	Title string `json:"title"`
	// Text is the lines the step printed, as printed (less the indent).
	Text []string `json:"text"`
	// Maps are the memory maps of reservations the step printed, each a
	// list of spans in address order.
	Maps [][]DemoSpanJSON `json:"maps"`
	// Refusals are the errors of the calls the step expected refused
	// (an empty string: a call that was not refused).
	Refusals []string `json:"refusals"`
	// Skipped says what parts of the step cannot run on this driver, and
	// why.
	Skipped []string `json:"skipped"`
	// Usage is each device's memory after the step's last memory map
	// (null when it printed none).
	Usage []DemoUsageJSON `json:"usage"`
}

// DemoSpanJSON is a span of a reservation's memory map.
type DemoSpanJSON struct {
	// OffsetBytes is the span's offset in the reservation, SizeBytes its
	// size, State its state (reserved, mapped, accessible...).
	OffsetBytes uint64 `json:"offset_bytes"`
	SizeBytes   uint64 `json:"size_bytes"`
	State       string `json:"state"`
	// Device, ChunkHandle and ChunkOffsetBytes name the chunk mapped
	// there (null where none is).
	Device           *int    `json:"device"`
	ChunkHandle      *uint64 `json:"chunk_handle"`
	ChunkOffsetBytes *uint64 `json:"chunk_offset_bytes"`
	// Access is each device's access to the span, where it has some.
	Access []DemoAccessJSON `json:"access"`
}

// DemoAccessJSON is a device's access to a span: read or read-write.
type DemoAccessJSON struct {
	Device int    `json:"device"`
	Access string `json:"access"`
}

// DemoUsageJSON is a device's memory.
type DemoUsageJSON struct {
	Device        int    `json:"device"`
	UsedBytes     uint64 `json:"used_bytes"`
	PeakBytes     uint64 `json:"peak_bytes"`
	CapacityBytes uint64 `json:"capacity_bytes"`
}

// jsonHelp is the --json flag's help.
const jsonHelp = "print one JSON document on stdout instead of text: sizes in bytes, times in seconds (the fields: docs/cli.md, section \"Machine-readable output\")"
