package disagg

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/transfer"
)

// TestEngineMatchesLocal: the two sides joined by two tcp transfer engines
// decode as one process does, fetch what Local would, and the engines
// count the bytes the sides do.
func TestEngineMatchesLocal(t *testing.T) {
	for _, layout := range []kvcache.Layout{kvcache.PerLayer, kvcache.TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			ctx := context.Background()
			s := newSides(t, layout, 256, 4)
			pe, err := transfer.New(transfer.Config{})
			require.NoError(t, err)
			defer pe.Close()
			de, err := transfer.New(transfer.Config{})
			require.NoError(t, err)
			defer de.Close()
			peer, err := de.Connect(ctx, pe.Addr())
			require.NoError(t, err)
			s.prefill, err = NewPrefill(s.pc, s.model, EngineExporter(pe))
			require.NoError(t, err)
			s.decode, err = NewDecode(s.dc, s.model, EngineFetcher(de, peer))
			require.NoError(t, err)
			rng := rand.New(rand.NewPCG(1, uint64(layout)))
			tpu := unitTokensOf(layout)
			base := randomTokens(rng, 2*tpu+6)
			var total uint64
			for _, p := range [][]int{base, append(slices.Clone(base[:2*tpu]), randomTokens(rng, 5)...), base, randomTokens(rng, tpu+3)} {
				cached := s.index.cached(p)
				h, err := s.prefill.Prefill(p, 0)
				require.NoError(t, err)
				res, err := s.decode.Decode(ctx, s.prefill, h, 4)
				require.NoError(t, err)
				want, wantLogits := reference(t, s.model, p, 4)
				require.Equal(t, want, res.Tokens)
				require.Equal(t, wantLogits, res.Logits)
				require.Equal(t, cached, res.Cached)
				total += res.Bytes
			}
			require.Equal(t, total, de.Stats().BytesIn)
			require.Equal(t, total, pe.Stats().BytesOut)
			require.NoError(t, peer.Close())
			require.NoError(t, s.prefill.Close())
		})
	}
}
