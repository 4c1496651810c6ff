package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/slidingwindow/ratelimit/internal/hotkeys"
)

// The slices of hot keys (internal/hotkeys' Slices). No label: a key is a
// request's values, which no metric names.
type sliceMetrics struct {
	local prometheus.Counter
	units *prometheus.CounterVec
	keys  prometheus.Gauge
	warm  prometheus.Counter
}

func newSliceMetrics() *sliceMetrics {
	return &sliceMetrics{
		local: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_hot_key_local_hits_total",
			Help: "Hits decided from a hot key's slice at this instance, without a Redis call.",
		}),
		units: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_hot_key_slice_units_total",
			Help: "Units of hot keys' slices: leased (charged to the counter before use) and given_back (unused when the slice ended).",
		}, []string{"event"}),
		keys: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_hot_keys",
			Help: "Counters holding a live slice at this instance, every second.",
		}),
		warm: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_hot_key_warm_slice_units_total",
			Help: "Units of slices leased to warm keys (under the hot threshold), also counted as leased in ratelimit_hot_key_slice_units_total.",
		}),
	}
}

func (s *sliceMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.local, s.units, s.keys, s.warm}
}

// SliceObserver is what hot keys' slices tell the metrics.
func (m *Metrics) SliceObserver() hotkeys.SliceObserver {
	if m == nil {
		return hotkeys.SliceObserver{}
	}
	leased, back := m.slices.units.WithLabelValues("leased"), m.slices.units.WithLabelValues("given_back")
	return hotkeys.SliceObserver{
		Local:     func(n int) { m.slices.local.Add(float64(n)) },
		Leased:    func(n uint64) { leased.Add(float64(n)) },
		GivenBack: func(n uint64) { back.Add(float64(n)) },
		Keys:      func(n int) { m.slices.keys.Set(float64(n)) },
		Warm:      func(n uint64) { m.slices.warm.Add(float64(n)) },
	}
}
