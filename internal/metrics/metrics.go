// Package metrics holds the service's Prometheus metrics, and beside them
// those of envoyproxy/ratelimit under its names (reference.go), which also
// go, with Stats, to statsd under the reference's statsd names. Labels are
// bounded by the config: per domain and rule, never per descriptor value, so
// a client cannot grow the series count; the reference's detailed_metric and
// value_to_metric, which name series by values, are capped at
// MaxReferenceSeries.
package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Outcome is the label of a decision.
type Outcome string

// The decision outcomes.
const (
	// WithinLimit: admitted, with more than the near-limit share left.
	WithinLimit Outcome = "within_limit"
	// NearLimit: admitted, with usage at or above the near-limit ratio.
	NearLimit Outcome = "near_limit"
	// OverLimit: denied.
	OverLimit Outcome = "over_limit"
	// ShadowWouldDeny: a shadow-mode rule over its limit, not enforced.
	ShadowWouldDeny Outcome = "shadow_would_deny"
	// FailureAllow: the store could not answer; the rule's failure_mode allowed.
	FailureAllow Outcome = "failure_allow"
	// FailureDeny: the store could not answer; the rule's failure_mode denied.
	FailureDeny Outcome = "failure_deny"
	// FailureDefer: the store could not answer and the rule has no
	// failure_mode: the request fails with UNAVAILABLE for Envoy to decide,
	// unless the rule is in shadow mode or another descriptor denies it.
	FailureDefer Outcome = "failure_defer"
	// Unlimited: an unlimited rule matched.
	Unlimited Outcome = "unlimited"
)

// Metrics are the collectors. A nil *Metrics records nothing, so code paths
// need no checks.
type Metrics struct {
	decisions        *prometheus.CounterVec
	storeDuration    prometheus.Histogram
	storeErrors      *prometheus.CounterVec
	invalidRequests  *prometheus.CounterVec
	shed             prometheus.Counter
	overloaded       prometheus.Counter
	configReloads    *prometheus.CounterVec
	configGeneration prometheus.Gauge
	configInfo       *prometheus.GaugeVec
	ruleLimits       *prometheus.GaugeVec
	refusals         *prometheus.CounterVec
	grpcConns        prometheus.Gauge

	ref     *referenceMetrics
	rlqs    *rlqsMetrics
	slices  *sliceMetrics
	regions *regionMetrics
}

// New registers the service's collectors, and Go's and the process's, on reg.
func New(reg prometheus.Registerer) *Metrics { return NewWithStats(reg, nil) }

// NewWithStats is New whose reference metrics also go to stats (nil: none).
func NewWithStats(reg prometheus.Registerer, stats Stats) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_decisions_total",
			Help: "Rate limit decisions per descriptor, by domain, rule and outcome.",
		}, []string{"domain", "rule", "outcome"}),
		storeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ratelimit_store_call_duration_seconds",
			Help: "Duration of a request's store work (per slot group on a cluster), queueing in its batch included, " +
				"failed ones included; refunds, admin calls.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .015, .025, .05, .1},
		}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_store_errors_total",
			Help: "Store calls that failed, by kind: timeout, canceled, connection, redis or reply (not overload: see ratelimit_overloaded_total).",
		}, []string{"kind"}),
		invalidRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_invalid_requests_total",
			Help: "Requests refused with INVALID_ARGUMENT, by reason (sizes over the --max-* bounds among them).",
		}, []string{"reason"}),
		shed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_requests_shed_total",
			Help: "Requests refused with RESOURCE_EXHAUSTED because --max-inflight requests were in flight.",
		}),
		overloaded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_overloaded_total",
			Help: "Requests whose deadline passed while they waited in the service for their store call, before it was sent: " +
				"the service was overloaded, the store was not at fault.",
		}),
		configReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_config_reloads_total",
			Help: "Config reloads by outcome: success, unchanged or failure.",
		}, []string{"outcome"}),
		configGeneration: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_config_generation",
			Help: "Generation of the config in force: 1 at start, +1 per reload that changed it.",
		}),
		configInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimit_config_info",
			Help: "1 for the hash of the config in force.",
		}, []string{"hash"}),
		ruleLimits: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimit_rule_limit",
			Help: "The limit each rule of the config in force sets: requests (units) per window, by domain, rule " +
				"(as ratelimit_decisions_total names it), algorithm and window in seconds. Unlimited rules have none.",
		}, []string{"domain", "rule", "algorithm", "window_seconds"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_transport_refusals_total",
			Help: "What the gRPC port's bounds refused, by reason: connections past --max-connections, and the lean " +
				"server's HTTP/2 bounds (streams, stream_bytes, message_size, slow_message, header_block, control_flood, " +
				"unread_answers, handshake).",
		}, []string{"reason"}),
		grpcConns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_grpc_connections",
			Help: "Connections open on the gRPC port (at most --max-connections).",
		}),
		ref:     newReferenceMetrics(stats),
		rlqs:    newRLQSMetrics(),
		slices:  newSliceMetrics(),
		regions: newRegionMetrics(),
	}
	reg.MustRegister(m.ref.collectors()...)
	reg.MustRegister(m.rlqs.collectors()...)
	reg.MustRegister(m.slices.collectors()...)
	reg.MustRegister(m.regions.collectors()...)
	reg.MustRegister(m.decisions, m.storeDuration, m.storeErrors, m.invalidRequests, m.shed, m.overloaded,
		m.configReloads, m.configGeneration, m.configInfo, m.ruleLimits, m.refusals, m.grpcConns,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Decision counts one descriptor's decision.
func (m *Metrics) Decision(domain, rule string, o Outcome) {
	if m != nil {
		m.decisions.WithLabelValues(domain, rule, string(o)).Inc()
	}
}

// StoreCall records a store call; errKind is empty for a success.
func (m *Metrics) StoreCall(d time.Duration, errKind string) {
	if m == nil {
		return
	}
	m.storeDuration.Observe(d.Seconds())
	if errKind != "" {
		m.storeErrors.WithLabelValues(errKind).Inc()
	}
	if errKind != "" && errKind != "canceled" {
		m.ref.redisError.add(1)
	}
}

// InvalidRequest counts a refused request.
func (m *Metrics) InvalidRequest(reason string) {
	if m != nil {
		m.invalidRequests.WithLabelValues(reason).Inc()
		m.ref.serviceError.add(1)
	}
}

// Shed counts a request refused for overload.
func (m *Metrics) Shed() {
	if m != nil {
		m.shed.Inc()
	}
}

// TransportRefusals starts the refusal counters of reasons at zero, so that
// a rate over them is defined before the first refusal.
func (m *Metrics) TransportRefusals(reasons ...string) {
	if m != nil {
		for _, r := range reasons {
			m.refusals.WithLabelValues(r)
		}
	}
}

// TransportRefused counts one refusal by the gRPC port's bounds.
func (m *Metrics) TransportRefused(reason string) {
	if m != nil {
		m.refusals.WithLabelValues(reason).Inc()
	}
}

// GRPCConnections counts connections opened (delta 1) and closed (-1) on
// the gRPC port.
func (m *Metrics) GRPCConnections(delta int) {
	if m != nil {
		m.grpcConns.Add(float64(delta))
	}
}

// Overloaded counts a request whose deadline passed before its store call
// was sent.
func (m *Metrics) Overloaded() {
	if m != nil {
		m.overloaded.Inc()
		m.ref.serviceError.add(1)
	}
}

// ConfigLoaded records the config now in force. outcome is "success" for a
// reload, "" for the first load.
func (m *Metrics) ConfigLoaded(generation uint64, hash, previousHash, outcome string) {
	if m == nil {
		return
	}
	if outcome != "" {
		m.configReloads.WithLabelValues(outcome).Inc()
	}
	m.ref.configLoadSuccess.add(1)
	m.configGeneration.Set(float64(generation))
	if previousHash != "" && previousHash != hash {
		m.configInfo.DeleteLabelValues(previousHash)
	}
	m.configInfo.WithLabelValues(hash).Set(1)
}

// RuleLimit is one limit a rule of the config sets, for RuleLimits.
type RuleLimit struct {
	Domain, Rule, Algorithm string
	Window                  time.Duration
	Requests                uint32
}

// RuleLimits replaces the configured limits the metrics show with limits
// (the config in force).
func (m *Metrics) RuleLimits(limits []RuleLimit) {
	if m == nil {
		return
	}
	m.ruleLimits.Reset()
	for _, l := range limits {
		m.ruleLimits.WithLabelValues(l.Domain, l.Rule, l.Algorithm, strconv.FormatInt(int64(l.Window/time.Second), 10)).
			Set(float64(l.Requests))
	}
}

// ConfigReload counts a reload that did not change the config in force:
// outcome "failure" (the previous config stays) or "unchanged". An
// unchanged one is no config_load_success: the file watch checks the files
// once as it starts, and the reference counts one load at start.
func (m *Metrics) ConfigReload(outcome string) {
	if m == nil {
		return
	}
	m.configReloads.WithLabelValues(outcome).Inc()
	if outcome == "failure" {
		m.ref.configLoadError.add(1)
	}
}
