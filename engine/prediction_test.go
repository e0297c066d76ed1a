package engine

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mkserve/mkserve/metrics"
)

// TestPredictionDraft: a draft from the prediction continues where the
// last one left off while the output follows it, finds the output's end
// again after an insertion or a deletion (nearest past the last place),
// starts from the first token, and is nil where the output's end occurs
// nowhere in the prediction.
func TestPredictionDraft(t *testing.T) {
	pred := []int32{10, 11, 12, 13, 14, 15, 16, 17, 11, 12, 20, 21, 22}
	for _, c := range []struct {
		name            string
		out             []int32
		predAt, predOut int // the sequence's record of the last draft
		k               int
		want            []int32
		wantAt          int
	}{
		{"first token", []int32{10}, 0, 0, 3, []int32{11, 12, 13}, 1},
		{"continues", []int32{10, 11, 12, 13}, 1, 1, 3, []int32{14, 15, 16}, 4},
		{"cut at the end", []int32{10, 11, 12, 13, 14, 15, 16, 17, 11, 12, 20, 21}, 9, 9, 4, []int32{22}, 12},
		{"insertion, rejoined", []int32{10, 11, 12, 13, 99, 98, 14, 15}, 4, 4, 2, []int32{16, 17}, 6},
		{"deletion: skipped ahead", []int32{10, 11, 12, 13, 20, 21}, 4, 4, 2, []int32{22}, 12},
		{"the later occurrence, past the last place", []int32{10, 11, 12, 13, 14, 15, 16, 17, 11, 12}, 5, 5, 2, []int32{20, 21}, 10},
		{"the first occurrence when none is past it", []int32{5, 11, 12}, 12, 12, 2, []int32{13, 14}, 3},
		{"nowhere", []int32{10, 11, 77, 78}, 2, 2, 3, nil, 2},
		{"the output ran past the prediction", []int32{10, 11, 12, 13, 14, 15, 16, 17, 11, 12, 20, 21, 22}, 12, 12, 3, nil, 12},
	} {
		t.Run(c.name, func(t *testing.T) {
			prompt := []int32{1, 2, 3}
			s := &sequence{req: &request{r: &Request{Prediction: pred}}, tokens: append(slices.Clone(prompt), c.out...), prompt: len(prompt),
				predAt: c.predAt, predOut: c.predOut}
			got := s.predictionDraft(c.k, nil)
			if !slices.Equal(got, c.want) || (got != nil && s.predAt != c.wantAt) {
				t.Errorf("draft %v from %d, want %v from %d", got, s.predAt, c.want, c.wantAt)
			}
		})
	}
}

// TestSpeculationPrediction: a request's prediction drafts its steps with
// speculation otherwise off — the output is the model's greedy output
// whatever the prediction, in far fewer steps when the prediction is the
// output or an edit of it, the accepted and rejected draft tokens counted
// in its usage — and is not used by a request that does not qualify.
func TestSpeculationPrediction(t *testing.T) {
	const V, N = 1024, 200
	next := func(t int32) int32 { return (t*17 + 5) % 1021 } // a long cycle: no n-gram repeats within N
	prompt := []int32{7, 8, 9}
	var reg *prometheus.Registry
	run := func(pred []int32, presence float32) ([]int32, *Usage, Stats) {
		reg = prometheus.NewRegistry()
		e, err := New(nextModel(V, next), fakeBackend{}, fakeDetok{}, Config{BlockSize: 4, KVCacheBytes: 1 << 20},
			Options{Name: "t", Clock: stillClock, Metrics: metrics.New(reg, "t")})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Shutdown(context.Background())
		ch, err := e.Generate(context.Background(), &Request{Prompt: prompt, Prediction: pred,
			Sampling: SamplingParams{MaxTokens: N, TopP: 1, RepetitionPenalty: 1, PresencePenalty: presence, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		var toks []int32
		var u *Usage
		for ev := range ch {
			if ev.Err != nil {
				t.Fatal(ev.Err)
			}
			toks = append(toks, ev.TokenIDs...)
			if ev.Usage != nil {
				u = ev.Usage
			}
		}
		return toks, u, settled(t, e)
	}
	e, err := New(nextModel(V, next), fakeBackend{}, fakeDetok{}, Config{BlockSize: 4, KVCacheBytes: 1 << 20}, Options{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	if _, err := e.Generate(context.Background(), &Request{Prompt: prompt, Prediction: []int32{3, V}, Sampling: SamplingParams{MaxTokens: 4}}); err == nil {
		t.Error("a prediction token outside the vocabulary was taken")
	}
	want, u0, plain := run(nil, 0)
	if len(want) != N || u0.AcceptedPredictionTokens != 0 || plain.SpecDrafted != 0 {
		t.Fatalf("without a prediction: %d tokens, usage %+v, %d drafted", len(want), u0, plain.SpecDrafted)
	}
	junk := []int32{1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009} // (never generated: next maps into [0, 1021) from ids below 1021, 1000+ appear only here)
	edited := slices.Concat(want[:50], junk, want[50:150], want[165:])
	for _, c := range []struct {
		name          string
		pred          []int32
		presence      float32
		maxSteps      int64
		minAccepted   int
		someRejected  bool
		usesPredicted bool
	}{
		// (a step keeps at most PredictionTokens drafts, then the model's own
		// token: 8 of 9 output tokens at best come from the prediction)
		{"the output itself", want, 0, plain.Steps / 4, N*PredictionTokens/(PredictionTokens+1) - 8, false, true},
		{"an edit of it (insertion, deletion)", edited, 0, plain.Steps / 2, 140, true, true},
		{"unrelated", junk, 0, plain.Steps, 0, false, true},
		{"with a presence penalty: not used", want, 0.1, plain.Steps, 0, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, u, st := run(c.pred, c.presence)
			t.Logf("%d steps (without: %d), drafted %d, usage %+v", st.Steps, plain.Steps, st.SpecDrafted, *u)
			if c.presence == 0 && !slices.Equal(got, want) {
				t.Errorf("output differs from greedy decoding:\n%v\n%v", got, want)
			}
			if st.Steps > c.maxSteps || u.AcceptedPredictionTokens < c.minAccepted || (u.RejectedPredictionTokens > 0) != c.someRejected {
				t.Errorf("%d steps (at most %d), %d accepted (at least %d), %d rejected", st.Steps, c.maxSteps,
					u.AcceptedPredictionTokens, c.minAccepted, u.RejectedPredictionTokens)
			}
			if int64(u.AcceptedPredictionTokens+u.RejectedPredictionTokens) != st.SpecDrafted {
				t.Errorf("usage counts %d prediction tokens, the engine drafted %d", u.AcceptedPredictionTokens+u.RejectedPredictionTokens, st.SpecDrafted)
			}
			if a, r := counterValue(t, reg, "mkserve:prediction_accepted_tokens_total"), counterValue(t, reg, "mkserve:prediction_rejected_tokens_total"); a != float64(u.AcceptedPredictionTokens) || r != float64(u.RejectedPredictionTokens) {
				t.Errorf("metrics count %v accepted and %v rejected prediction tokens, usage %d and %d", a, r, u.AcceptedPredictionTokens, u.RejectedPredictionTokens)
			}
			if !c.usesPredicted && st.SpecDrafted != 0 {
				t.Errorf("%d tokens drafted for a request that does not qualify", st.SpecDrafted)
			}
		})
	}
}

// TestPredictionDraftText: with the tokens' bytes, a reply that writes the
// predicted text in other tokens than the prediction's stays in place —
// no draft inside one of the prediction's tokens, a draft from the next
// boundary the two share — and one that leaves the text is found again
// by its tokens, its place in the text with it.
func TestPredictionDraftText(t *testing.T) {
	vocab := []string{"a", "b", "ab", "c", "abc", "x", " ", "d"}
	tb := func(id int32) []byte { return []byte(vocab[id]) }
	pred := []int32{2, 3, 6, 7} // "ab" "c" " " "d"
	for _, c := range []struct {
		name     string
		out      []int32
		want     []int32
		wantByte int
	}{
		{"inside the prediction's first token", []int32{0}, nil, 1},
		{"its end reached in two tokens", []int32{0, 1}, []int32{3, 6, 7}, 2},
		{"two of its tokens in one", []int32{4}, []int32{6, 7}, 3},
		{"in step with its tokens", []int32{2, 3, 6}, []int32{7}, 4},
		{"off the text, found again by tokens", []int32{5, 2, 3}, []int32{6, 7}, 3},
		{"off the text, nowhere", []int32{5, 5}, nil, -1},
		{"at the text's end", []int32{4, 6, 7}, nil, 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			prompt := []int32{1, 1}
			s := &sequence{req: &request{r: &Request{Prediction: pred}}, tokens: append(slices.Clone(prompt), c.out...), prompt: len(prompt)}
			got := s.predictionDraft(8, tb)
			byteAt := s.predByte
			if s.predOff {
				byteAt = -1
			}
			if !slices.Equal(got, c.want) || byteAt != c.wantByte {
				t.Errorf("draft %v at byte %d, want %v at byte %d", got, byteAt, c.want, c.wantByte)
			}
		})
	}
}

// MetricOf is the one series of family name in reg (for this package's
// tests, internal and external).
func MetricOf(t *testing.T, reg *prometheus.Registry, name string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0]
		}
	}
	t.Fatalf("no %s", name)
	return nil
}

// counterValue is the value of the one-series counter name in reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	return MetricOf(t, reg, name).GetCounter().GetValue()
}

// TestPredictionWithOptions: with the output itself as its prediction, a
// request's choices, text, finish reasons and log-probabilities are those
// it has without one — n = 2, a stop string inside a drafted run,
// max_tokens short of the prediction, log-probabilities — and usage sums
// the choices' prediction tokens.
func TestPredictionWithOptions(t *testing.T) {
	const V = 1024
	next := func(t int32) int32 { return (t*17 + 5) % 1021 }
	prompt := []int32{7, 8, 9}
	type out struct {
		toks    map[int][]int32
		text    map[int]string
		reasons map[int]string
		lps     map[int][]string
		usage   Usage
	}
	run := func(sp SamplingParams, pred []int32) out {
		e, err := New(nextModel(V, next), fakeBackend{}, fakeDetok{}, Config{BlockSize: 4, KVCacheBytes: 1 << 22},
			Options{Name: "t", Clock: stillClock})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Shutdown(context.Background())
		ch, err := e.Generate(context.Background(), &Request{Prompt: prompt, Prediction: pred, Sampling: sp})
		if err != nil {
			t.Fatal(err)
		}
		o := out{toks: map[int][]int32{}, text: map[int]string{}, reasons: map[int]string{}, lps: map[int][]string{}}
		for ev := range ch {
			if ev.Err != nil {
				t.Fatal(ev.Err)
			}
			o.toks[ev.Index] = append(o.toks[ev.Index], ev.TokenIDs...)
			o.text[ev.Index] += ev.Text
			for _, lp := range ev.Logprobs {
				o.lps[ev.Index] = append(o.lps[ev.Index], fmt.Sprintf("%d:%.4f:%d", lp.ID, lp.Logprob, len(lp.Top)))
			}
			if ev.FinishReason != "" {
				o.reasons[ev.Index] = ev.FinishReason
			}
			if ev.Usage != nil {
				o.usage = *ev.Usage
			}
		}
		return o
	}
	base := SamplingParams{MaxTokens: 120, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true}
	full := run(base, nil).toks[0]
	stop, _ := fakeDetok{}.Decode(full[70:72], false)
	for _, c := range []struct {
		name string
		edit func(*SamplingParams)
	}{
		{"n = 2", func(p *SamplingParams) { p.N = 2 }},
		{"a stop string inside a drafted run", func(p *SamplingParams) { p.Stop = []string{stop} }},
		{"max_tokens short of the prediction", func(p *SamplingParams) { p.MaxTokens = 37 }},
		{"log-probabilities", func(p *SamplingParams) { p.Logprobs, p.TopLogprobs = true, 2 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			sp := base
			c.edit(&sp)
			want, got := run(sp, nil), run(sp, full)
			if fmt.Sprint(got.toks, got.text, got.reasons, got.lps) != fmt.Sprint(want.toks, want.text, want.reasons, want.lps) {
				t.Errorf("with the prediction:\n%v %v %v\nwithout:\n%v %v %v", got.toks, got.text, got.reasons, want.toks, want.text, want.reasons)
			}
			if got.usage.CompletionTokens != want.usage.CompletionTokens || got.usage.AcceptedPredictionTokens == 0 ||
				got.usage.AcceptedPredictionTokens > got.usage.CompletionTokens {
				t.Errorf("usage %+v, without the prediction %+v", got.usage, want.usage)
			}
		})
	}
}

// TestUnpredictable: the sampling parameters that rule a prediction out
// are named; the others, defaults included, are not.
func TestUnpredictable(t *testing.T) {
	for _, c := range []struct {
		p    SamplingParams
		want string
	}{
		{SamplingParams{}, ""},
		{SamplingParams{RepetitionPenalty: 1, Temperature: 0.7, TopK: 5, MinTokens: 3, Logprobs: true}, ""},
		{SamplingParams{PresencePenalty: 0.1}, "presence_penalty"},
		{SamplingParams{FrequencyPenalty: -0.2}, "frequency_penalty"},
		{SamplingParams{RepetitionPenalty: 1.1}, "repetition_penalty"},
		{SamplingParams{RepetitionPenalty: 1, LogitBias: map[int32]float32{3: 1}}, "logit_bias"},
	} {
		if got := c.p.Unpredictable(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.p, got, c.want)
		}
	}
}
