package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"distflash/config"
)

// TestHybridTrainsLikeOneWorker: 4 in-process ranks in 2 Ulysses groups of 2
// (parallelism.ulysses_degree = 2), with zigzag or distflash between the groups, follow the
// loss curve of one worker over 20 steps within TestSequenceParallelTrainsLikeOneWorker's
// bound (1e-6 relative; the curves differ by summation order only).
func TestHybridTrainsLikeOneWorker(t *testing.T) {
	want := trainLosses(t, "checkpoint.activation=attn_output")
	for _, name := range []string{"zigzag", "distflash"} {
		t.Run(name+"/P4/U2", func(t *testing.T) {
			got := trainLosses(t, "checkpoint.activation=attn_output", "parallelism.world_size=4",
				"parallelism.sequence_parallel_degree=4", "parallelism.ulysses_degree=2", "parallelism.attention="+name)
			worst := 0.0
			for i := range want {
				d := math.Abs(got[i]-want[i]) / want[i]
				worst = math.Max(worst, d)
				if d > 1e-6 {
					t.Errorf("step %d: loss %.7f on 4 ranks (2 groups of 2), %.7f on one (rel diff %.2e)", i+1, got[i], want[i], d)
				}
			}
			t.Logf("loss %.6f -> %.6f; worst relative difference from one worker over %d steps: %.2e", got[0], got[len(got)-1], len(got), worst)
		})
	}
}

// TestHybridDocumentMaskTrainsLikeOneWorker: with packed documents under the document mask,
// and with parallelism.balance_documents (which then balances the 2 groups), 4 ranks in groups
// of 2 follow one worker's masked curve within 1e-6.
func TestHybridDocumentMaskTrainsLikeOneWorker(t *testing.T) {
	docs := writeShortDocs(t, 3000)
	sets := []string{"checkpoint.activation=attn_output", "data.train=" + docs, "data.format=jsonl",
		"data.document_mask=true", "data.position_reset=true"}
	want := trainLosses(t, sets...)
	for _, balance := range []string{"false", "true"} {
		got := trainLosses(t, append(slices.Clone(sets), "parallelism.world_size=4", "parallelism.sequence_parallel_degree=4",
			"parallelism.ulysses_degree=2", "parallelism.attention=zigzag", "parallelism.balance_documents="+balance)...)
		worst := 0.0
		for i := range want {
			worst = math.Max(worst, math.Abs(got[i]-want[i])/want[i])
		}
		if worst > 1e-6 {
			t.Errorf("balance_documents=%s: worst relative loss difference from one worker %.2e > 1e-6", balance, worst)
		}
		t.Logf("zigzag between 2 groups of 2, balance_documents=%s: worst relative difference from one worker %.2e", balance, worst)
	}
}

// TestConfigUlyssesDegree: parallelism.ulysses_degree must be at least 1 and divide the
// sequence-parallel degree, attn2d takes none, and the Ulysses groups must be able to split
// the heads; each refusal names the file, the key and the value.
func TestConfigUlyssesDegree(t *testing.T) {
	for _, c := range []struct {
		file string
		sets []string
		want []string
	}{
		{"configs/tiny-sp4.toml", []string{"parallelism.ulysses_degree=3"}, []string{"configs/tiny-sp4.toml", "parallelism.ulysses_degree = 3", "parallelism.sequence_parallel_degree = 4"}},
		{"configs/tiny-sp4.toml", []string{"parallelism.ulysses_degree=0"}, []string{"parallelism.ulysses_degree = 0", ">= 1"}},
		{"configs/tiny-sp4.toml", []string{"parallelism.ulysses_degree=2", "parallelism.attention=attn2d"}, []string{"parallelism.ulysses_degree = 2", "attn2d"}},
		{"configs/llama-33h.toml", []string{"parallelism.ulysses_degree=2"}, []string{"configs/llama-33h.toml", "parallelism.ulysses_degree = 2", "n_heads (33)"}},
	} {
		_, err := config.Load(c.file, c.sets)
		if err == nil {
			t.Errorf("%s %v: accepted", c.file, c.sets)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s %v: error %q does not say %q", c.file, c.sets, err, w)
			}
		}
	}
	for _, sets := range [][]string{
		{"parallelism.ulysses_degree=2"}, {"parallelism.ulysses_degree=4", "parallelism.attention=burst"},
		{"parallelism.ulysses_degree=2", "parallelism.attention=ulysses"}, {"parallelism.ulysses_degree=1", "parallelism.attention=attn2d"},
	} {
		cfg, err := config.Load("configs/tiny-sp4.toml", sets)
		if err != nil {
			t.Errorf("%v: %v", sets, err)
			continue
		}
		if u := cfg.Parallelism.UlyssesDegree; u > 1 && cfg.Parallelism.Attention != "ulysses" && !strings.Contains(cfg.Summary(), fmt.Sprintf("ulysses groups of %d", u)) {
			t.Errorf("%v: summary %q does not name the groups", sets, cfg.Summary())
		}
	}
}
