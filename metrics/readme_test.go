package metrics_test

import (
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/metrics"
)

// TestDocsListEveryMetric: the Metrics section of docs/cli.md names every
// metric a collector sends, in the paragraph of its kind (which begins
// with the kind's prefix), and names none that no collector sends.
func TestDocsListEveryMetric(t *testing.T) {
	page, err := os.ReadFile("../docs/cli.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(page), "\n## Metrics\n")
	require.True(t, ok, "docs/cli.md has a Metrics section")
	section, _, _ = strings.Cut(section, "\n## ")

	// The paragraph of each kind, by prefix.
	paragraphs := map[string]string{}
	for _, p := range strings.Split(section, "\n\n") {
		p = strings.ReplaceAll(p, "\n", " ")
		for _, kind := range []string{"kvcache", "allocator", "arena", "pool"} {
			prefix := "vmarena_" + kind + "_"
			if strings.Contains(p, "`"+prefix+"`") {
				require.NotContains(t, paragraphs, prefix, "one paragraph for %s", prefix)
				paragraphs[prefix] = p
			}
		}
	}
	require.Len(t, paragraphs, 4)

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, metrics.Register(reg, newObjects(t).collectors(t, "x")...))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	sent := map[string]bool{}
	for _, mf := range mfs {
		name := mf.GetName()
		found := false
		for prefix, p := range paragraphs {
			if short, ok := strings.CutPrefix(name, prefix); ok {
				found = strings.Contains(p, "`"+short+"`") || strings.Contains(p, "`"+short+"{")
				sent[prefix+short] = true
			}
		}
		require.True(t, found, "the Metrics section of docs/cli.md names %s in its kind's paragraph", name)
	}
	for prefix, p := range paragraphs {
		parts := strings.Split(p, "`")
		for i := 1; i < len(parts); i += 2 { // what is between backquotes
			short, _, _ := strings.Cut(parts[i], "{")
			if parts[i] == prefix || !strings.Contains(short, "_") || strings.ContainsAny(short, " (=") {
				continue
			}
			if strings.HasPrefix(short, "prefix_cache_") || strings.HasPrefix(short, "kv_cache_") || short == "cache_hit_rate" ||
				short == "token_usage" || short == "num_preemptions" {
				continue // vLLM's and SGLang's names
			}
			require.True(t, sent[prefix+short], "docs/cli.md names %s%s, which no collector sends", prefix, short)
		}
	}
}
