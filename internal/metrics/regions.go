package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidingwindow/ratelimit/internal/regions"
)

// One limit across regions (internal/regions): the ledger's calls, the
// grants, and the state of the global keys this instance decides.
type regionMetrics struct {
	ledger    *prometheus.HistogramVec
	keys      *prometheus.GaugeVec
	allowance prometheus.Gauge
}

func newRegionMetrics() *regionMetrics {
	return &regionMetrics{
		ledger: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimit_global_ledger_call_duration_seconds",
			Help:    "Renewals of a region's grant of a global limit on the ledger, by result (ok, error).",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .15, .25, .5, 1, 2.5},
		}, []string{"result"}),
		keys: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimit_global_keys",
			Help: "Global counters this instance decides, by state: held (a grant lives), cut (a grant ended unrenewed: when_cut decides), waiting (no grant seen yet: the floor decides).",
		}, []string{"state"}),
		allowance: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_global_allowance_units",
			Help: "The limits this region decides its global counters with, summed over the counters this instance decides.",
		}),
	}
}

func (r *regionMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{r.ledger, r.keys, r.allowance}
}

// RegionsObserver is what the regions' decider tells the metrics.
func (m *Metrics) RegionsObserver() regions.Observe {
	if m == nil {
		return regions.Observe{}
	}
	ok, failed := m.regions.ledger.WithLabelValues("ok"), m.regions.ledger.WithLabelValues("error")
	held, cut, waiting := m.regions.keys.WithLabelValues("held"), m.regions.keys.WithLabelValues("cut"), m.regions.keys.WithLabelValues("waiting")
	return regions.Observe{
		Renewed:      func(_ uint64, took time.Duration) { ok.Observe(took.Seconds()) },
		LedgerFailed: func(_ error, took time.Duration) { failed.Observe(took.Seconds()) },
		Keys: func(k regions.KeyStates) {
			held.Set(float64(k.Held))
			cut.Set(float64(k.Cut))
			waiting.Set(float64(k.Waiting))
			m.regions.allowance.Set(float64(k.Allowance))
		},
	}
}
