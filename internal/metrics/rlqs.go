package metrics

import "github.com/prometheus/client_golang/prometheus"

// The Rate Limit Quota Service's metrics. Labels are the config's (domain
// and rule of a matched bucket), never a bucket id's values.
type rlqsMetrics struct {
	streams     prometheus.Gauge
	requests    *prometheus.CounterVec
	assignments *prometheus.CounterVec
	unmatched   prometheus.Counter
}

func newRLQSMetrics() *rlqsMetrics {
	return &rlqsMetrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_rlqs_streams",
			Help: "Open RateLimitQuotaService streams: one per Envoy and domain.",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_rlqs_requests_total",
			Help: "Requests Envoys reported for the buckets of a rule, by domain, rule and outcome (allowed or denied in Envoy).",
		}, []string{"domain", "rule", "outcome"}),
		assignments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_rlqs_assignments_total",
			Help: "Assignments sent for the buckets of a rule, by domain, rule and kind: token_bucket, deny_all, allow_all, " +
				"or none (the store could not lease: Envoy's assignment runs out at its time to live).",
		}, []string{"domain", "rule", "kind"}),
		unmatched: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_rlqs_unmatched_total",
			Help: "Bucket reports that matched no rule (or an unknown domain): answered ALLOW_ALL.",
		}),
	}
}

func (r *rlqsMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{r.streams, r.requests, r.assignments, r.unmatched}
}

// RLQSStream counts a stream opened (+1) or closed (-1).
func (m *Metrics) RLQSStream(delta int) {
	if m != nil {
		m.rlqs.streams.Add(float64(delta))
	}
}

// RLQSReport counts one bucket's report of a rule: the requests Envoy
// allowed and denied, and the kind of assignment sent back.
func (m *Metrics) RLQSReport(domain, rule string, allowed, denied uint64, kind string) {
	if m == nil {
		return
	}
	m.rlqs.requests.WithLabelValues(domain, rule, "allowed").Add(float64(allowed))
	m.rlqs.requests.WithLabelValues(domain, rule, "denied").Add(float64(denied))
	m.rlqs.assignments.WithLabelValues(domain, rule, kind).Inc()
}

// RLQSUnmatched counts a bucket report that matched no rule.
func (m *Metrics) RLQSUnmatched() {
	if m != nil {
		m.rlqs.unmatched.Inc()
	}
}
