package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/sim"
)

// updateJSON rewrites the --json golden files: go test ./cmd/vmarena
// -run TestJSON -update-json.
var updateJSON = flag.Bool("update-json", false, "rewrite testdata/json/*.json from this run")

// checkJSON checks a --json run: exit 0, nothing on stderr, one JSON
// document on stdout that decodes into schema (a pointer to the command's
// Go type) with no field the type lacks, and that equals the golden file
// testdata/json/name.json once normalize has blanked what varies from run
// to run or machine to machine.
func checkJSON(t *testing.T, name string, schema any, normalize func(map[string]any), args ...string) {
	t.Helper()
	code, out, errOut := runCmd(t, args...)
	require.Equal(t, 0, code, errOut)
	require.Empty(t, errOut)

	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(schema), "the document is the schema's type")
	require.False(t, dec.More(), "one document")

	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	if normalize != nil {
		normalize(doc)
	}
	got, err := json.MarshalIndent(roundFloats(doc), "", "  ")
	require.NoError(t, err)
	got = append(got, '\n')
	golden := filepath.Join("testdata", "json", name+".json")
	if *updateJSON {
		require.NoError(t, os.WriteFile(golden, got, 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err, "run with -update-json to write it")
	var wantDoc any
	require.NoError(t, json.Unmarshal(want, &wantDoc))
	want, err = json.MarshalIndent(roundFloats(wantDoc), "", "  ")
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(got))

	// Field names are snake_case; every size's name ends _bytes.
	for _, k := range regexp.MustCompile(`"([^"]+)":`).FindAllStringSubmatch(out, -1) {
		require.Regexp(t, `^[a-z][a-z0-9_]*$`, k[1])
	}
}

// roundFloats rounds every number in a decoded document to 9 significant
// digits, so that the golden files do not depend on the last bits of a
// platform's floating point (fused multiply-adds on arm64).
func roundFloats(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			v[k] = roundFloats(x)
		}
	case []any:
		for i, x := range v {
			v[i] = roundFloats(x)
		}
	case float64:
		r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 9, 64), 64)
		return r
	}
	return v
}

// TestJSONReplay: the hand-written two-device trace, a device a column.
func TestJSONReplay(t *testing.T) {
	checkJSON(t, "replay", &ReplayJSON{}, nil, "replay", "--trace", filepath.Join(traceDir, "handmade_two_devices.csv"), "--json")
}

// TestJSONReplayStopped: a replay an error stopped still prints its
// document, the stopped trace's device marked, its figures those of the
// events before the error (the trace's own figures, its peak among
// them, are of the whole trace), and exits 1.
func TestJSONReplayStopped(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.csv")
	require.NoError(t, os.WriteFile(big, []byte("seq,device,op,size,addr,alloc_id,stream,time_us,device_free\n"+
		"4,0,alloc,1024,0,0,0,,\n5,0,alloc,134217728,0,1,0,,\n"), 0o600))
	code, out, errOut := runReplay(t, "--capacity", "64MiB", "--json", "--trace", filepath.Join(traceDir, "handmade_two_devices.csv"), "--trace", big)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "big.csv: replay: line 3 (seq 5)")
	var doc ReplayJSON
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&doc))
	require.Len(t, doc.Devices, 3)
	for _, d := range doc.Devices[:2] {
		require.False(t, d.Stopped, d.Label)
		require.Equal(t, "handmade_two_devices", d.Trace)
		require.NotNil(t, d.Peak)
		require.NotEmpty(t, d.LargestAtPeak)
	}
	last := doc.Devices[2]
	require.True(t, last.Stopped)
	require.Equal(t, "big", last.Trace)
	require.Equal(t, "big (stopped after 1 of 2 events)", last.Label)
	require.Equal(t, 1, last.Allocs)
	// The trace's own figures (its peak, what was live then) are of the
	// whole trace, the allocation that failed included.
	require.Equal(t, []PeakAllocJSON{{AllocID: 1, SizeBytes: 128 << 20, Line: 3, Seq: 5}, {AllocID: 0, SizeBytes: 1024, Line: 2, Seq: 4}},
		last.LargestAtPeak)
}

// TestJSONKV: the first 12 requests of the Azure conversation trace;
// the simulation's wall time and CPU time vary, so they are blanked. The
// driver figures hold together: the calls by kind add up to the total,
// the priced time is the calls times the A100 table's prices, the time
// steps waited for is at most all of it, and its share is of the GPU
// time.
func TestJSONKV(t *testing.T) {
	checkJSON(t, "kv-simulate", &KVSimulateJSON{}, func(doc map[string]any) {
		require.Equal(t, sim.A100.Name, doc["driver_priced_by"])
		require.Equal(t, 16.0, doc["map_ahead_tokens"])
		for i, s := range doc["schemes"].([]any) {
			s := s.(map[string]any)
			require.GreaterOrEqual(t, s["wall_seconds"], 0.0)
			require.GreaterOrEqual(t, s["cpu_seconds"], 0.0)
			s["wall_seconds"], s["cpu_seconds"] = 0, 0
			checkDriverJSON(t, s, sim.A100)
			require.Equal(t, i == 0, s["driver_calls_counted"], "this cache's calls are counted, the baselines make none")
		}
	}, "kv", "simulate", "--trace", filepath.Join(requestsDir, "AzureLLMInferenceTrace_conv.csv"),
		"--model", "llama3-8b", "--memory", "4GiB", "--limit", "12", "--json")
}

// TestJSONDevices: the CUDA and ACL stand-ins of two devices each; the
// host's devices depend on the machine, so their figures are blanked,
// and the libraries' paths are a temporary directory's.
func TestJSONDevices(t *testing.T) {
	cudaLib, aclLib := standinCUDA(t, 2), standinACL(t, 2)
	checkJSON(t, "devices", &DevicesJSON{}, func(doc map[string]any) {
		host := doc["host"].(map[string]any)
		require.Equal(t, true, host["available"])
		for _, d := range host["devices"].([]any) {
			d := d.(map[string]any)
			require.Greater(t, d["capacity_bytes"], 0.0)
			d["capacity_bytes"] = 0
			delete(d, "numa_node")
		}
		for _, v := range []string{"cuda", "acl"} {
			doc[v].(map[string]any)["library"] = "(stand-in)"
		}
	}, "devices", "--cuda-library", cudaLib, "--acl-library", aclLib, "--json")
}

// TestJSONDemo: the demo on the sim driver, each of its steps: the same
// text as without --json, a step at a time.
func TestJSONDemo(t *testing.T) {
	var doc DemoJSON
	checkJSON(t, "demo", &doc, nil, "demo", "--driver", "sim", "--json")
	code, text, errOut := runCmd(t, "demo", "--driver", "sim")
	require.Equal(t, 0, code, errOut)
	var b strings.Builder
	b.WriteString(doc.Header + "\n")
	for _, s := range doc.Steps {
		b.WriteString(s.Title + "\n" + strings.Join(s.Text, "\n") + "\n")
	}
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, regexp.MustCompile(`^\d+\. `).ReplaceAllString(l, ""))
		}
	}
	require.Equal(t, strings.Join(lines, "\n")+"\n", b.String())
	require.Len(t, doc.Steps, 14)
}

// TestReplayWraps: a table of several devices too wide for a terminal is
// printed a block per device, each with the row labels, no line as wide
// as the side-by-side table's; one that fits is printed side by side.
func TestReplayWraps(t *testing.T) {
	code, out, errOut := runReplay(t, "--trace", filepath.Join(traceDir, "handmade_two_devices.csv"),
		"--trace", filepath.Join(traceDir, "silmont2000_mem_snapshot.csv"))
	require.Equal(t, 0, code, errOut)
	tbl, _ := cutLargest(out)
	blocks := strings.Split(strings.TrimSuffix(tbl, "\n"), "\n\n")[1:]
	require.Len(t, blocks, 3)
	for i, label := range []string{"handmade_two_devices [dev 0]", "handmade_two_devices [dev 1]", "silmont2000_mem_snapshot"} {
		first, _, _ := strings.Cut(blocks[i], "\n")
		require.Regexp(t, `^trace {2,}`+regexp.QuoteMeta(label)+`$`, first)
		require.Equal(t, strings.Count(blocks[0], "\n"), strings.Count(blocks[i], "\n"), "every block has every row")
	}
	table := printedTable(t, out)
	require.Greater(t, tableWidth(table), maxTableWidth, "too wide side by side")
	for _, l := range strings.Split(out, "\n")[1:] {
		require.Less(t, len([]rune(l)), tableWidth(table), "%q", l)
	}

	var buf bytes.Buffer
	narrow := [][]string{{"trace", "a", "b"}, {"events", "1", "2"}}
	printWrapped(&buf, narrow)
	require.Equal(t, "trace   a  b\nevents  1  2\n", buf.String())
}

// checkDriverJSON checks one scheme's driver figures of kv simulate
// --json against the table that priced them.
func checkDriverJSON(t *testing.T, s map[string]any, costs sim.CallCosts) {
	t.Helper()
	calls := s["driver_calls"].(map[string]any)
	var c sim.Calls
	for k, p := range map[string]*uint64{"reserve": &c.Reserve, "unreserve": &c.Unreserve, "create": &c.Create,
		"release": &c.Release, "map": &c.Map, "unmap": &c.Unmap, "set_access": &c.SetAccess} {
		*p = uint64(calls[k].(float64))
	}
	require.Equal(t, float64(c.Total()), calls["total"], "the calls by kind add up to the total")
	total := s["driver_seconds"].(float64)
	require.InDelta(t, c.Time(costs).Seconds(), total, 1e-9, "priced time = calls x prices")
	exposed, background := s["exposed_driver_seconds"].(float64), s["background_driver_seconds"].(float64)
	require.LessOrEqual(t, exposed, total+1e-12)
	require.LessOrEqual(t, background, total+1e-12)
	require.LessOrEqual(t, s["admission_driver_seconds"].(float64), total+1e-12)
	if gpu := s["gpu_seconds"].(float64); gpu > 0 {
		require.InDelta(t, exposed/gpu, s["exposed_driver_share"], 1e-9)
	}
	require.LessOrEqual(t, s["gpu_seconds"], s["simulated_seconds"])
	if s["driver_calls_counted"] == false {
		require.Zero(t, total)
		require.Zero(t, c.Total())
	}
}
