package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/race"
)

// requestsDir holds the first 200 requests of each real request trace.
const requestsDir = "../../serving/testdata/requests"

func runKV(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(append([]string{"kv"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

// writeTrace writes a request trace into a fresh directory.
func writeTrace(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	return p
}

// TestKVSimulate serves the first 50 requests of each real trace and
// checks the header (the longest of those requests, rounded up to a block,
// is the max context; this cache's shape, token-major by default), the
// table's rows, and that off a terminal it writes no progress; the figures
// are serving's to test.
func TestKVSimulate(t *testing.T) {
	if race.Enabled {
		// 100 s under the detector: three schemes simulated on one
		// goroutine, where it can find nothing. scripts/test runs it
		// without -race.
		t.Skip("a long one-goroutine simulation; run without -race")
	}
	for _, tc := range []struct {
		file, model, header, blocks, cache string
	}{
		{"AzureLLMInferenceTrace_conv.csv", "llama3-8b",
			"model llama3-8b (128 KiB of KV a token), KV budget 20 GiB, max context 4160 tokens, at most 256 sequences and 8192 tokens a step; steps priced by the A100 80GB roofline",
			"prompt blocks: the trace names none, so no two requests share content",
			"this cache: kvcache: 256 slots of 520 MiB, token-major, 260 groups of 16 tokens in 2 MiB a slot, reserving 130.00 GiB of address space;"},
		{"AzureLLMInferenceTrace_code.csv", "llama-7b",
			"model llama-7b (512 KiB of KV a token), KV budget 20 GiB, max context 7456 tokens,",
			"prompt blocks: the trace names none",
			"this cache: kvcache: 256 slots of 3728 MiB, token-major, 1864 groups of 4 tokens in 2 MiB a slot, reserving 932.00 GiB of address space;"},
		{"mooncake_synthetic_trace.jsonl", "llama3-8b",
			"max context 56416 tokens,",
			"prompt blocks (hash_ids of 512 tokens): 1399, 57 named before by an earlier request, holding 4.2% of prompt tokens",
			"this cache: kvcache: 256 slots of 7052 MiB, token-major, 3526 groups of 16 tokens in 2 MiB a slot, reserving 1.72 TiB of address space;"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			code, out, errOut := runKV(t, "simulate", "--trace", filepath.Join(requestsDir, tc.file), "--model", tc.model, "--memory", "20GiB", "--limit", "50")
			require.Equal(t, 0, code, errOut)
			flat := flatten(out)
			require.Contains(t, flat, "vmarena kv simulate: "+tc.file+", 50 requests over ")
			require.Contains(t, flat, tc.header)
			require.Contains(t, flat, tc.blocks)
			require.Contains(t, flat, tc.cache)
			require.Contains(t, flat, " preempts by drop; admits with room for the prompt\n")
			require.Contains(t, flat, "\nscheme this cache (token-major) paged (vLLM) static\n")
			require.Contains(t, flat, "\nrequests finished 50 of 50 50 of 50 50 of 50\n")
			for _, row := range []string{"refused (longer than max context) 0 0 0", "peak concurrent sequences", "mean concurrent sequences",
				"KV in use by running sequences, peak", "KV in use by running sequences, mean", "KV waste, mean (of in use)", "KV waste, peak", "KV cached for reuse, mean / peak",
				"saved by prefix sharing, mean / peak", "prefix cache: tokens found / looked up", "cached blocks evicted",
				"preemptions", "commit calls (per second)", "time to first token, mean", "time to first token, median / p99",
				"output tokens per second", "tokens computed (prompts, recomputes, decodes)", "steps", "simulated time", "simulation wall time",
				"failed admits / resumes (CanAdmit agreed, then no room)", "driver calls: create / release / map / unmap / set access",
				"driver time, all / in the background (mapping ahead) / before serving", "driver time steps waited for (of GPU time)",
				"driver time per admission (of its prefill)", "the scheme's own CPU time (thread clock), ÷ paged", "GPU time of the steps"} {
				require.Contains(t, flat, "\n"+row, row)
			}
			require.Empty(t, errOut, "off a terminal the run is quiet: no progress")
		})
	}
}

// TestKVSimulateHandmade: the two requests of serving's
// TestSimulatePreemptionByHand (16-token prompts, 20 output tokens each,
// arriving together) in 8 MiB of llama3-8b KV, four 16-token blocks or
// pages, or one 64-token reservation: this cache and the paged scheme run
// both and preempt one (serving's TestKVCachePreemptionByHand: the cache
// reclaims the idle pages of the finished one rather than evict, and its
// resume looks its prompt up again), the static one runs one at a time;
// and two Mooncake requests with the same hash id, the second finding the
// first's two full blocks (this cache, with llama-7b's 4 tokens a page,
// holds 36 of the 40 tokens, 2 whole blocks counted found).
func TestKVSimulateHandmade(t *testing.T) {
	azure := writeTrace(t, "two.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"+
		"2023-11-16 18:15:46.0000000,16,20\n2023-11-16 18:15:46.0000000,16,20\n")
	code, out, errOut := runKV(t, "simulate", "--trace", azure, "--model", "llama3-8b", "--memory", "8MiB", "--max-context", "64")
	require.Equal(t, 0, code, errOut)
	flat := flatten(out)
	require.Contains(t, flat, "KV budget 8 MiB, max context 64 tokens,")
	for _, want := range []string{
		`requests finished 2 of 2 2 of 2 2 of 2`,
		`peak concurrent sequences 2 2 1`,
		`preemptions 1 1 0`,
		`cached blocks evicted 0 2 0`,
		`prefix cache: tokens found / looked up 16 / 48 \(33\.3%\) 16 / 32 \(50\.0%\) —`,
		`commit calls \(per second\) 7 \(\S+/s\) 7 \(\S+/s\) 2 \(\S+/s\)`,
		`KV in use by running sequences, peak 8\.00 MiB 8\.00 MiB 8\.00 MiB`,
		`tokens computed \(prompts, recomputes, decodes\) 86 86 70`,
		`steps 23 23 40`,
	} {
		require.Regexp(t, `(?m)^`+want+`$`, flat)
	}

	mooncake := writeTrace(t, "two.jsonl",
		`{"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [7]}`+"\n"+
			`{"timestamp": 1000, "input_length": 40, "output_length": 2, "hash_ids": [7]}`+"\n")
	code, out, errOut = runKV(t, "simulate", "--trace", mooncake, "--model", "llama-7b", "--memory", "1GiB")
	require.Equal(t, 0, code, errOut)
	flat = flatten(out)
	require.Contains(t, flat, "max context 48 tokens,", "42 tokens, in whole blocks")
	require.Contains(t, flat, "prompt blocks (hash_ids of 512 tokens): 2, 1 named before by an earlier request, holding 50.0% of prompt tokens")
	require.Regexp(t, `(?m)^prefix cache: tokens found / looked up 32 / 64 \(50\.0%\) 32 / 64 \(50\.0%\) —$`, flat)
	require.Regexp(t, `(?m)^tokens computed \(prompts, recomputes, decodes\) 46 50 82$`, flat)

	// A request of 3 samples: this cache forks two, the paged and static
	// schemes serve them as requests of one prompt; the JSON says so too.
	samples := writeTrace(t, "samples.jsonl",
		`{"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [7], "n": 3}`+"\n")
	code, out, errOut = runKV(t, "simulate", "--trace", samples, "--model", "llama-7b", "--memory", "1GiB")
	require.Equal(t, 0, code, errOut)
	flat = flatten(out)
	require.Regexp(t, `(?m)^requests finished 3 of 3 3 of 3 3 of 3$`, flat)
	require.Regexp(t, `(?m)^samples beyond one a request 2 2 2$`, flat)
	require.Regexp(t, `(?m)^samples forked / queued as requests 2 / 0 - \(requests of one prompt\) - \(requests of one prompt\)$`, flat)
	code, out, errOut = runKV(t, "simulate", "--trace", samples, "--model", "llama-7b", "--memory", "1GiB", "--json")
	require.Equal(t, 0, code, errOut)
	var doc KVSimulateJSON
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.Equal(t, 3, doc.Schemes[0].Requests)
	require.Equal(t, 2, doc.Schemes[0].Samples)
	require.Equal(t, 2, doc.Schemes[0].Forks)
	require.Zero(t, doc.Schemes[1].Forks)

	// Per-layer, a sequence's first token takes a page in each of 64
	// regions: 128 MiB, more than 8 MiB holds.
	code, out, errOut = runKV(t, "simulate", "--trace", azure, "--model", "llama3-8b", "--memory", "8MiB", "--max-context", "64", "--layout", "per-layer")
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "serving: this cache (per-layer) will not admit request 0 (16 tokens of context) with nothing running: it can never run")
	code, out, errOut = runKV(t, "simulate", "--trace", azure, "--model", "llama3-8b", "--memory", "256MiB", "--max-context", "64",
		"--layout", "per-layer", "--preempt", "swap")
	require.Equal(t, 0, code, errOut)
	flat = flatten(out)
	require.Contains(t, flat, "this cache: kvcache: 256 slots of 128 MiB, per-layer, 64 regions of 2 MiB (1 pages of 2 MiB) a slot, reserving 32.00 GiB of address space; preempts by swap;")
	require.Contains(t, flat, "\nscheme this cache (per-layer) paged (vLLM) static\n")
	require.Regexp(t, `(?m)^peak concurrent sequences 2 2 2$`, flat)

	// --layout auto (the default) takes the contiguous layout for a
	// token that divides no page, at the page --page-size gives.
	code, out, errOut = runKV(t, "simulate", "--trace", azure, "--model", "qwen2.5-7b", "--memory", "256MiB", "--max-context", "64",
		"--page-size", "64KiB")
	require.Equal(t, 0, code, errOut)
	flat = flatten(out)
	require.Contains(t, flat, "contiguous, 56 pages of 64 KiB a slot, a token every 56 KiB")
	require.Contains(t, flat, "\nscheme this cache (contiguous) paged (vLLM) static\n")

	// --admit expected-output says so in the header.
	code, out, errOut = runKV(t, "simulate", "--trace", azure, "--model", "llama3-8b", "--memory", "8MiB", "--max-context", "64", "--admit", "expected-output")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, flatten(out), "; preempts by drop; admits with room for the prompt and an expected output, the mean of the requests finished so far\n")
	require.Contains(t, flatten(out), "; the page pool warmed before serving with the budget, or every token of the trace if less (--warm budget)\n")

	// --warm step warms a step's tokens before serving, and says so.
	code, out, errOut = runKV(t, "simulate", "--trace", azure, "--model", "llama3-8b", "--memory", "8MiB", "--max-context", "64", "--warm", "step")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, flatten(out), "; the page pool warmed before serving with a step's tokens, the rest during steps and idle gaps (--warm step)\n")

	// The hybrid cache's pools are warmed with a step's tokens unless
	// --warm budget is given, and the header says which.
	code, out, errOut = runKV(t, "simulate", "--trace", azure, "--model", "llama3-8b", "--memory", "8MiB", "--max-context", "64", "--scheme", "hybrid")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, flatten(out), "; the page pool warmed before serving with a step's tokens, the rest during steps and idle gaps (--warm step)\n")
	for _, tc := range []struct{ warm, says string }{
		{"budget", "; the page pool warmed before serving with the budget, or every token of the trace if less (--warm budget)\n"},
		{"step", "; the page pool warmed before serving with a step's tokens, the rest during steps and idle gaps (--warm step)\n"},
	} {
		code, out, errOut = runKV(t, "simulate", "--trace", azure, "--model", "llama3-8b", "--memory", "8MiB", "--max-context", "64", "--scheme", "hybrid", "--warm", tc.warm)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, flatten(out), tc.says)
	}
}

// TestKVSimulateModels: --model takes a preset or a Hugging Face
// config.json (its path, or its directory's), and the header says the
// model's KV a token and what is made of a sliding window; a model of
// sliding-window or recurrent layers is served by the hybrid schemes
// unless --scheme uniform, a full-attention one by the uniform schemes
// unless --scheme hybrid.
func TestKVSimulateModels(t *testing.T) {
	azure := writeTrace(t, "two.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"+
		"2023-11-16 18:15:46.0000000,16,20\n2023-11-16 18:15:46.0000000,16,20\n")
	for _, tc := range []struct {
		model, memory, maxContext string
		says                      []string
		scheme                    string
	}{
		{"deepseek-v3", "64MiB", "64", []string{"model deepseek-v3 (70272 B of KV a token)"}, ""},
		{modelsDir + "/DeepSeek-V2-Lite/config.json", "64MiB", "64", []string{"model DeepSeek-V2-Lite (31104 B of KV a token)"}, ""},
		{modelsDir + "/Qwen2.5-7B-Instruct", "64MiB", "64", []string{"model Qwen2.5-7B-Instruct (56 KiB of KV a token)"}, ""},
		{"mistral-7b", "64MiB", "64", []string{"model mistral-7b (128 KiB of KV a token)",
			"\nsliding window: all 32 layers of mistral-7b attend to the last 4096 tokens, no fewer than the max context of 64, so the window drops no token and the figures are exact\n"}, "uniform"},
		{modelsDir + "/Mistral-7B-v0.1", "2GiB", "8192", []string{"model Mistral-7B-v0.1 (128 KiB of KV a token)",
			"\nsliding window not modelled: all 32 layers of Mistral-7B-v0.1 attend to the last 4096 tokens only,"}, "uniform"},
		{"gemma-3-27b", "2GiB", "2048", []string{"\nhybrid schemes: the exact need of a sequence is its 10 full attention layers' tokens, 52 window layers' last 1024 tokens",
			"\nthis cache: kvcache.Hybrid of 2 groups (full 10 layers, window 52 layers holding their last 1024 tokens) in pages of 2 MiB;",
			"this cache (hybrid)", "paged (vLLM hybrid)", "\nKV in use ÷ exact need, mean "}, ""},
		{"qwen3-next-80b-a3b", "256MiB", "64", []string{"36 recurrent layers' states (38592 KiB a sequence)",
			"paged hybrid: 20 blocks of 544 tokens in 4 KV cache groups of 12 layers (13056 KiB a block)"}, ""},
		{"deepseek-v3", "64MiB", "64", []string{"kvcache.Hybrid of 1 groups (latent 61 layers)", "paged (vLLM hybrid)"}, "hybrid"},
	} {
		args := []string{"simulate", "--trace", azure, "--model", tc.model, "--memory", tc.memory, "--max-context", tc.maxContext, "--max-seqs", "4"}
		if tc.scheme != "" {
			args = append(args, "--scheme", tc.scheme)
		}
		code, out, errOut := runKV(t, args...)
		require.Equal(t, 0, code, errOut)
		finished := `(?m)^requests finished 2 of 2 2 of 2 2 of 2$`
		if strings.Contains(out, "paged (vLLM hybrid)") {
			finished = `(?m)^requests finished 2 of 2 2 of 2$`
		}
		require.Regexp(t, finished, flatten(out), tc.model)
		for _, s := range tc.says {
			require.Contains(t, out, s, tc.model)
		}
	}
}

// modelsDir holds config.json files of Hugging Face models.
const modelsDir = "../../serving/testdata/models"

func TestKVFlags(t *testing.T) {
	small := filepath.Join(requestsDir, "AzureLLMInferenceTrace_conv.csv")
	noLayers := writeTrace(t, "config.json", `{"num_attention_heads": 32, "hidden_size": 4096, "torch_dtype": "bfloat16"}`)
	emptyDir := t.TempDir() // a model directory without its config.json
	code, out, _ := runKV(t, "simulate", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, out, "usage: vmarena kv simulate")
	code, out, _ = runKV(t, "--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "usage: vmarena kv simulate")

	for _, tc := range []struct {
		args []string
		says string
	}{
		{nil, "vmarena kv: no subcommand, want simulate"},
		{[]string{"simulat"}, `vmarena kv: unknown subcommand "simulat", want simulate`},
		{[]string{"simulate"}, "no trace given: want --trace FILE, an Azure or BurstGPT trace .csv or a Mooncake or Bailian trace .jsonl"},
		{[]string{"simulate", "--trace", small}, "no model given: want --model and a preset (deepseek-v2-lite, deepseek-v3, gemma-3-27b, "},
		{[]string{"simulate", "--trace", small, "--model", "gpt2"},
			`vmarena kv simulate: --model gpt2: serving: no model preset "gpt2", want one of deepseek-v2-lite, deepseek-v3, gemma-3-27b, gpt-oss-120b, llama-7b, llama3-8b, llama3.1-70b, llama3.1-8b, llama3.3-70b, mistral-7b, qwen2.5-7b, qwen3-next-80b-a3b, or the path of a Hugging Face config.json`},
		{[]string{"simulate", "--trace", small, "--model", "absent/config.json"}, "--model absent/config.json: serving: model config: open absent/config.json: no such file or directory"},
		{[]string{"simulate", "--trace", small, "--model", "/dev/zero"}, "--model /dev/zero: serving: model config: /dev/zero is a character device, not a regular file"},
		{[]string{"simulate", "--trace", small, "--model", emptyDir}, "--model " + emptyDir + ": serving: model config: the directory " + emptyDir + " has no config.json"},
		{[]string{"simulate", "--trace", small, "--model", noLayers}, `: no "num_hidden_layers": add it, the number of decoder layers`},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "extra"}, `unexpected argument "extra"`},
		{[]string{"simulate", "--trace"}, "flag needs an argument: -trace"},
		{[]string{"simulate", "--trace", small, "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--layout", "columnar"}, "--layout columnar: want auto or token-major or contiguous or per-layer"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--page-size", "0"}, `invalid value "0" for flag -page-size: "0" is zero`},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--page-size", "3000"}, "--page-size 3000 B: want a power of two from 4 KiB (the smallest driver granularity) to 1 GiB"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--page-size", "2KiB"}, "--page-size 2 KiB: want a power of two from 4 KiB"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--page-size", "4GiB"}, "--page-size 4 GiB: want a power of two from 4 KiB"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--preempt", "pause"}, "--preempt pause: want drop or swap"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--admit", "output"}, "--admit output: want prompt or expected-output"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--warm", "half"}, "--warm half: want budget or step"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--memory", "1000TiB"}, "--memory 1000 TiB: more than the 65024 GiB this cache's prefix store can reserve"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--scheme", "paged"}, "--scheme paged: want auto or uniform or hybrid"},
		{[]string{"simulate", "--trace", small, "--model", "gemma-3-27b", "--layout", "per-layer"},
			"--layout is the uniform cache's: the hybrid schemes (--scheme auto, model gemma-3-27b) have none; give --scheme uniform"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--scheme", "hybrid", "--preempt", "swap"}, "--preempt is the uniform cache's"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--limit", "-1"}, "--limit -1: want a number of requests, or 0 for all"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--limit", "many"}, `invalid value "many" for flag -limit`},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--memory", "0"}, `invalid value "0" for flag -memory: "0" is zero`},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--memory", "lots"}, `invalid value "lots" for flag -memory`},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--memory", "1MiB"},
			"--memory 1 MiB: holds not one block of 16 tokens of llama3-8b (2 MiB): want at least 2 MiB"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--memory", "8GiB", "--max-context", "100000"},
			"--max-context 100000: --memory 8 GiB holds at most 65536 tokens of llama3-8b for one sequence"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--max-context", "-5"}, "--max-context -5: want a number of tokens, or 0 to fit the trace"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--max-seqs", "0"}, "--max-seqs 0: want 1 to 1048576"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--max-batched-tokens", "0"}, "--max-batched-tokens 0: want 1 to 16777216"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--prices", "b200"}, "--prices b200: want a100 or h100"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--prices", ""}, "--prices : want a100 or h100"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--map-ahead=maybe"}, `invalid boolean value "maybe" for -map-ahead`},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--kv-events", "127.0.0.1:5557"},
			`--kv-events 127.0.0.1:5557: kvevents: endpoint "127.0.0.1:5557": neither a tcp:// nor an ipc:// endpoint (want tcp://HOST:PORT, HOST * for every interface, PORT 0 for a free one, or ipc://PATH)`},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--kv-events", "tcp://127.0.0.1:99999"}, "the port is not a number from 0 to 65535"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--kv-events", "tcp://127.0.0.1:0", "--kv-events-replay", "inproc://r"},
			`--kv-events-replay inproc://r: kvevents: endpoint "inproc://r": inproc:// reaches only sockets of the same process`},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--kv-events", "tcp://127.0.0.1:65535", "--kv-events-dp-rank", "1"},
			"the port offset by data-parallel rank 1 is past 65535"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--kv-events", "tcp://127.0.0.1:0", "--kv-events-dp-rank", "-1"}, "--kv-events-dp-rank -1: want 0 to 65535"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--kv-events-dp-rank", "1"}, "need --kv-events"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--kv-events", "tcp://127.0.0.1:0", "--kv-events-layout", "tuple"}, "--kv-events-layout tuple: want array or map"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--kv-events", "tcp://127.0.0.1:0", "--kv-events-linger", "-1s"}, "--kv-events-linger -1s: want 0 or more"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--kv-events-topic", "kv"}, "--kv-events-topic, --kv-events-replay, --kv-events-layout, --kv-events-dp-rank, --kv-events-vllm-hash-seed and --kv-events-linger need --kv-events"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--kv-events-vllm-hash-seed", "0"}, "need --kv-events"},
		{[]string{"simulate", "--trace", small, "--model", "llama3-8b", "--kv-events-layout", "map"}, "need --kv-events"},
	} {
		code, out, errOut := runKV(t, tc.args...)
		require.Equal(t, 2, code, "%v", tc.args)
		require.Empty(t, out, "%v", tc.args)
		require.Contains(t, errOut, tc.says, "%v", tc.args)
		require.Regexp(t, `\nrun 'vmarena kv( simulate)? --help' for usage\n$`, errOut, "%v", tc.args)
	}
}

// TestKVPrices: --prices h100 prices this cache's calls by the H100
// table, and --map-ahead=false puts every call on the steps' path, so
// that they wait for more of it (idle gaps between requests still hide
// what they can). Each run's driver time is its own calls at its table's
// prices; the calls themselves may differ between runs by a few, since
// exposed driver time lengthens steps and so moves the schedule (which
// pages the pool has when).
func TestKVPrices(t *testing.T) {
	small := filepath.Join(requestsDir, "AzureLLMInferenceTrace_conv.csv")
	doc := func(args ...string) KVSimulateJSON {
		t.Helper()
		code, out, errOut := runKV(t, append([]string{"simulate", "--trace", small, "--model", "llama3-8b", "--memory", "4GiB", "--limit", "12", "--json"}, args...)...)
		require.Equal(t, 0, code, errOut)
		var d KVSimulateJSON
		require.NoError(t, json.Unmarshal([]byte(out), &d))
		return d
	}
	a100, h100, off := doc(), doc("--prices", "h100"), doc("--prices", "h100", "--map-ahead=false")
	require.Equal(t, sim.A100.Name, a100.DriverPricedBy)
	require.Equal(t, sim.H100.Name, h100.DriverPricedBy)
	require.Equal(t, 16, h100.MapAheadTokens)
	require.Equal(t, 0, off.MapAheadTokens)
	priced := func(d KVSimulateJSON, table sim.CallCosts) {
		t.Helper()
		c := d.Schemes[0].DriverCalls
		calls := sim.Calls{Reserve: c.Reserve, Unreserve: c.Unreserve, Create: c.Create, Release: c.Release, Map: c.Map, Unmap: c.Unmap, SetAccess: c.SetAccess}
		require.Positive(t, calls.Total())
		require.Equal(t, calls.Total(), c.Total)
		require.InDelta(t, calls.Time(table).Seconds(), d.Schemes[0].DriverSeconds, 1e-9)
	}
	priced(a100, sim.A100)
	priced(h100, sim.H100)
	priced(off, sim.H100)
	require.Zero(t, off.Schemes[0].BackgroundDriverSeconds)
	require.LessOrEqual(t, off.Schemes[0].ExposedDriverSeconds, off.Schemes[0].DriverSeconds, "idle gaps hide what they can")
	require.Positive(t, h100.Schemes[0].BackgroundDriverSeconds)
	require.Less(t, h100.Schemes[0].ExposedDriverSeconds, off.Schemes[0].ExposedDriverSeconds)
	for _, d := range []KVSimulateJSON{a100, h100, off} {
		for _, s := range d.Schemes[1:] {
			require.False(t, s.DriverCallsCounted, s.Scheme)
			require.Zero(t, s.DriverSeconds, s.Scheme)
		}
	}
}

// TestKVHybridMapAhead: the hybrid cache maps ahead unless
// --map-ahead=false, as the uniform one does: its decodes' commits run in
// the background of the step before, and off, every call is on the
// steps' path.
func TestKVHybridMapAhead(t *testing.T) {
	small := filepath.Join(requestsDir, "AzureLLMInferenceTrace_conv.csv")
	doc := func(args ...string) KVSimulateJSON {
		t.Helper()
		code, out, errOut := runKV(t, append([]string{"simulate", "--trace", small, "--model", "mistral-7b", "--scheme", "hybrid",
			"--memory", "4GiB", "--limit", "12", "--json"}, args...)...)
		require.Equal(t, 0, code, errOut)
		var d KVSimulateJSON
		require.NoError(t, json.Unmarshal([]byte(out), &d))
		return d
	}
	on, off := doc(), doc("--map-ahead=false")
	require.Equal(t, 16, on.MapAheadTokens)
	require.Equal(t, 0, off.MapAheadTokens)
	require.Positive(t, on.Schemes[0].BackgroundDriverSeconds)
	require.Zero(t, off.Schemes[0].BackgroundDriverSeconds)
	require.Less(t, on.Schemes[0].ExposedDriverSeconds, off.Schemes[0].ExposedDriverSeconds)
}

// TestKVFailures: a trace that cannot be read exits 1 with the file in
// the message and prints no table.
func TestKVFailures(t *testing.T) {
	zero := filepath.Join(t.TempDir(), "zero.jsonl")
	require.NoError(t, os.Symlink("/dev/zero", zero))
	for _, tc := range []struct {
		name, file, says string
	}{
		{"missing file", filepath.Join(t.TempDir(), "absent.csv"), "absent.csv: serving: request trace: open"},
		{"a header only", writeTrace(t, "empty.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"), "empty.csv: the trace holds no requests, nothing to simulate"},
		{"an empty jsonl", writeTrace(t, "empty.jsonl", ""), "empty.jsonl: the trace holds no requests, nothing to simulate"},
		{"a device", zero, "zero.jsonl: serving: request trace: " + zero + " is a character device, not a regular file"},
		{"malformed", writeTrace(t, "bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,x,1\n"),
			`bad.csv: serving: line 2: ContextTokens "x" is not an integer`},
		{"no format", writeTrace(t, "trace.txt", "hello\n"), `no request trace format for extension ".txt"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runKV(t, "simulate", "--trace", tc.file, "--model", "llama3-8b")
			require.Equal(t, 1, code)
			require.Empty(t, out)
			require.Contains(t, errOut, "vmarena kv simulate: ")
			require.Contains(t, errOut, tc.says)
		})
	}
}

// TestKVAdmitAhead: --admit-ahead schedules a step ahead for every
// scheme: the header says so, every request still finishes, the paged
// scheme still makes no driver call, and this cache's pool is warmed
// before serving (startup_driver_seconds: as without the flag, where the
// cache maps ahead; none with --map-ahead=false).
func TestKVAdmitAhead(t *testing.T) {
	small := filepath.Join(requestsDir, "AzureLLMInferenceTrace_conv.csv")
	args := []string{"simulate", "--trace", small, "--model", "llama3-8b", "--memory", "4GiB", "--limit", "12"}
	code, out, errOut := runKV(t, append(args, "--admit-ahead")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "scheduling a step ahead")
	code, out, errOut = runKV(t, append(args, "--admit-ahead", "--json")...)
	require.Equal(t, 0, code, errOut)
	var d KVSimulateJSON
	require.NoError(t, json.Unmarshal([]byte(out), &d))
	for _, s := range d.Schemes {
		require.Equal(t, 12, s.Finished+s.Refused, s.Scheme)
	}
	require.False(t, d.Schemes[1].DriverCallsCounted)
	require.LessOrEqual(t, d.Schemes[0].ExposedDriverSeconds, d.Schemes[0].DriverSeconds)
	require.Positive(t, d.Schemes[0].StartupDriverSeconds)
	require.LessOrEqual(t, d.Schemes[0].StartupDriverSeconds+d.Schemes[0].BackgroundDriverSeconds, d.Schemes[0].DriverSeconds)
	startup := d.Schemes[0].StartupDriverSeconds
	code, out, errOut = runKV(t, append(args, "--json")...)
	require.Equal(t, 0, code, errOut)
	d = KVSimulateJSON{}
	require.NoError(t, json.Unmarshal([]byte(out), &d))
	require.Equal(t, startup, d.Schemes[0].StartupDriverSeconds, "mapping ahead, the cache warms its pool before serving either way")
	code, out, errOut = runKV(t, append(args, "--json", "--map-ahead=false")...)
	require.Equal(t, 0, code, errOut)
	d = KVSimulateJSON{}
	require.NoError(t, json.Unmarshal([]byte(out), &d))
	require.Zero(t, d.Schemes[0].StartupDriverSeconds, "every call on the steps' path")
}
