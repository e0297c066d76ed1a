package metrics

import "github.com/prometheus/client_golang/prometheus"

// RegisterWeights exports the memory of the model's weights by the form
// that holds them (mkserve:weights_bytes{form="bf16"|"q8"|…}), set once
// the model has loaded; forms with no bytes are left out.
func RegisterWeights(reg prometheus.Registerer, model string, bytes map[string]int64) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name:        prefix + "weights_bytes",
		Help:        "Memory held by the model's weights, by the form that holds them (cpu: f32, bf16, q8, fp4; cuda: f32, bf16, fp4).",
		ConstLabels: prometheus.Labels{"model_name": model},
	}, []string{"form"})
	for form, n := range bytes {
		if n > 0 {
			g.WithLabelValues(form).Set(float64(n))
		}
	}
	reg.MustRegister(g)
}
