package metrics

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// The metrics below carry envoyproxy/ratelimit's Prometheus names and labels:
// the names its statsd-to-Prometheus mapping (src/stats/prom/
// default_mapper.yaml, also Envoy Gateway's statsd_conf.yaml) gives its
// stats, so that dashboards and alerts written for it (Envoy Gateway's
// global-ratelimit dashboard among them) work unchanged. With a Stats, the
// same counts also go out under the reference's statsd names.

// MaxReferenceSeries bounds the descriptor series of the reference's
// rate_limit metrics. Rules name their series from the config (bounded);
// detailed_metric and value_to_metric put request values in them, as the
// reference does, and past this many series a new one is counted under
// its rule's config name instead, so a client cannot grow them for ever.
const MaxReferenceSeries = 10_000

// Stats receives the reference's stats under its statsd names, beside the
// Prometheus series: internal/statsd sends them with the reference's own
// stats library. A name is whole and without tags, e.g.
// "ratelimit.service.rate_limit.<key>.total_hits".
type Stats interface {
	Counter(name string) StatCounter
	Timer(name string) StatTimer
}

// StatCounter is a statsd counter: what is added is sent as a delta.
type StatCounter interface{ Add(delta uint64) }

// StatTimer is a statsd timer, in milliseconds.
type StatTimer interface{ AddValue(ms float64) }

// counter is one of the reference's counters: its Prometheus series and,
// with Stats, its statsd counter.
type counter struct {
	prom prometheus.Counter
	stat StatCounter // nil without Stats
}

func (c counter) add(n uint64) {
	c.prom.Add(float64(n))
	if c.stat != nil {
		c.stat.Add(n)
	}
}

// The roots of the reference's statsd names (src/stats/manager_impl.go,
// src/service_cmd/runner/runner.go).
const (
	statService = "ratelimit.service."
	statServer  = "ratelimit_server."
)

// referenceMetrics are the collectors of the reference's names.
type referenceMetrics struct {
	totalHits, overLimit, nearLimit, withinLimit, shadowMode *prometheus.CounterVec

	shouldRateLimitError *prometheus.CounterVec
	totalRequests        *prometheus.CounterVec
	responseTime         *prometheus.HistogramVec

	redisError, serviceError                             counter
	configLoadSuccess, configLoadError, globalShadowMode counter

	stats   Stats    // nil: Prometheus only
	series  sync.Map // stat key → *DescriptorSeries
	nSeries atomic.Int64
	capped  prometheus.Counter // hits of the bound
	// The statsd domain_not_found counters, by domain.
	notFound  sync.Map
	nNotFound atomic.Int64
	methods   sync.Map // gRPC full method → *methodSeries
}

// methodSeries are the total_requests and response_time of one gRPC method.
type methodSeries struct {
	requests     counter
	duration     prometheus.Observer
	statDuration StatTimer // nil without Stats
}

// counter pairs the Prometheus series prom with the statsd counter name,
// when there is a Stats.
func (r *referenceMetrics) counter(prom prometheus.Counter, name string) counter {
	c := counter{prom: prom}
	if r.stats != nil {
		c.stat = r.stats.Counter(name)
	}
	return c
}

func newReferenceMetrics(stats Stats) *referenceMetrics {
	labels := []string{"domain", "key1", "key2"}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	r := &referenceMetrics{
		stats: stats,
		totalHits: counter("ratelimit_service_rate_limit_total_hits",
			"envoyproxy/ratelimit's total_hits: hits (request costs) on a limit, by domain and the first two levels of the rule's key."),
		overLimit: counter("ratelimit_service_rate_limit_over_limit",
			"envoyproxy/ratelimit's over_limit: hits past the limit (shadow-mode rules included)."),
		nearLimit: counter("ratelimit_service_rate_limit_near_limit",
			"envoyproxy/ratelimit's near_limit: hits past --near-limit-ratio of the limit and within it."),
		withinLimit: counter("ratelimit_service_rate_limit_within_limit", "envoyproxy/ratelimit's within_limit: hits admitted."),
		shadowMode: counter("ratelimit_service_rate_limit_shadow_mode",
			"envoyproxy/ratelimit's shadow_mode: hits past the limit of a shadow_mode rule, admitted."),
		shouldRateLimitError: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_service_should_rate_limit_error",
			Help: "envoyproxy/ratelimit's should_rate_limit errors: " +
				"err_type redis_error (a failed store call) or service_error (a refused request, an overload).",
		}, []string{"err_type"}),
		totalRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_service_total_requests",
			Help: "envoyproxy/ratelimit's total_requests: gRPC calls, by method.",
		}, []string{"grpc_method"}),
		responseTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimit_service_response_time_seconds",
			Help:    "envoyproxy/ratelimit's response_time: duration of gRPC calls, by method.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"grpc_method"}),
	}
	r.capped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_metric_series_capped_total",
		Help: "Descriptors whose series, named from request values (detailed_metric, value_to_metric), were counted " +
			"under their rule's name instead: the reference's rate_limit metrics hold MaxReferenceSeries series at most.",
	})
	r.redisError = r.counter(r.shouldRateLimitError.WithLabelValues("redis_error"), statService+"call.should_rate_limit.redis_error")
	r.serviceError = r.counter(r.shouldRateLimitError.WithLabelValues("service_error"), statService+"call.should_rate_limit.service_error")
	r.configLoadSuccess = r.counter(prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_service_config_load_success",
		Help: "envoyproxy/ratelimit's config_load_success: configs put in force, the first and every reload that changed it.",
	}), statService+"config_load_success")
	r.configLoadError = r.counter(prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_service_config_load_error",
		Help: "envoyproxy/ratelimit's config_load_error: reloads refused.",
	}), statService+"config_load_error")
	r.globalShadowMode = r.counter(prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_service_global_shadow_mode",
		Help: "envoyproxy/ratelimit's global_shadow_mode: requests over a limit answered OK because of --shadow-mode.",
	}), statService+"global_shadow_mode")
	return r
}

func (r *referenceMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{r.totalHits, r.overLimit, r.nearLimit, r.withinLimit, r.shadowMode,
		r.shouldRateLimitError, r.totalRequests, r.responseTime,
		r.configLoadSuccess.prom, r.configLoadError.prom, r.globalShadowMode.prom, r.capped}
}

// DescriptorSeries are the reference's five rate_limit counters of one stat
// key. A nil *DescriptorSeries records nothing.
type DescriptorSeries struct {
	totalHits, overLimit, nearLimit, withinLimit, shadowMode counter
}

// Descriptor returns the series of statKey, the reference's name of a limit
// (config.Rule.StatKey, or the key detailed_metric and value_to_metric
// build); fallback is the rule's own StatKey, used in its place once
// MaxReferenceSeries series exist. The labels are those of the reference's
// mapping: the key with ':' and '|' and the dots of IPv4 addresses made
// '_', split at dots into domain, key1 and key2 (later parts dropped). The
// statsd names are the reference's: ratelimit.service.rate_limit.<key>.<stat>,
// the key made so. The bound holds for both.
func (m *Metrics) Descriptor(statKey, fallback string) *DescriptorSeries {
	if m == nil {
		return nil
	}
	r := m.ref
	if s, ok := r.series.Load(statKey); ok {
		return s.(*DescriptorSeries)
	}
	if statKey != fallback && r.nSeries.Load() >= MaxReferenceSeries {
		r.capped.Inc()
		return m.Descriptor(fallback, fallback)
	}
	name := sanitizeStatName(statKey)
	labels := statLabels(name)
	stat := func(vec *prometheus.CounterVec, suffix string) counter {
		c := counter{prom: vec.WithLabelValues(labels[:]...)}
		if r.stats != nil { // the statsd name only with statsd
			c.stat = r.stats.Counter(statService + "rate_limit." + name + "." + suffix)
		}
		return c
	}
	s := &DescriptorSeries{
		totalHits:   stat(r.totalHits, "total_hits"),
		overLimit:   stat(r.overLimit, "over_limit"),
		nearLimit:   stat(r.nearLimit, "near_limit"),
		withinLimit: stat(r.withinLimit, "within_limit"),
		shadowMode:  stat(r.shadowMode, "shadow_mode"),
	}
	if actual, loaded := r.series.LoadOrStore(statKey, s); loaded {
		return actual.(*DescriptorSeries)
	}
	r.nSeries.Add(1)
	return s
}

var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// sanitizeStatName is the reference's utils.SanitizeStatName: ':' and '|'
// and the dots of IPv4 addresses made '_'.
func sanitizeStatName(key string) string {
	key = strings.NewReplacer(":", "_", "|", "_").Replace(key)
	return ipv4.ReplaceAllStringFunc(key, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
}

// statLabels maps a sanitized stat key as the reference's mapping does: its
// patterns ratelimit.service.rate_limit.*.*.<stat> (domain, key1) and its
// regex for three parts and more (domain, key1, key2). key2 is empty for a
// two-part key: Prometheus stores an empty label as no label, the series
// the reference exports.
func statLabels(key string) [3]string {
	var l [3]string
	parts := strings.SplitN(key, ".", 4)
	copy(l[:], parts)
	return l
}

// Hits counts one descriptor's decision as the reference does, in hits (the
// request's cost), not requests. limit is the limit in force; before is
// what the counter held before this request (0 when unknown) and after
// what it would hold with the request's cost; admitted says whether the
// request was; shadow whether the rule is in shadow mode; nearRatio is
// --near-limit-ratio.
func (s *DescriptorSeries) Hits(cost, limit, before uint64, admitted, shadow bool, nearRatio float64) {
	if s == nil {
		return
	}
	s.totalHits.add(cost)
	after := before + cost
	near := uint64(float64(limit) * nearRatio) // floor, as the reference
	if admitted {
		s.withinLimit.add(cost)
		if after > near {
			s.nearLimit.add(after - max(before, near))
		}
		return
	}
	over := cost
	if before < limit {
		over = after - limit
		s.nearLimit.add(limit - max(near, before))
	}
	s.overLimit.add(over)
	if shadow {
		s.shadowMode.add(over)
	}
}

// Total counts hits whose decision the store could not make: the
// reference counts total_hits before it asks Redis.
func (s *DescriptorSeries) Total(cost uint64) {
	if s != nil {
		s.totalHits.add(cost)
	}
}

// DomainNotFound counts the descriptors of a request to a domain the config
// does not have, as the reference's statsd counter
// ratelimit.service.rate_limit.<domain>.domain_not_found (its Prometheus
// mapping has none, nor has this service). The domain is the client's:
// past MaxReferenceSeries domains, new ones are not counted.
func (m *Metrics) DomainNotFound(domain string, descriptors int) {
	if m == nil || m.ref.stats == nil {
		return
	}
	r := m.ref
	c, ok := r.notFound.Load(domain)
	if !ok {
		if r.nNotFound.Load() >= MaxReferenceSeries {
			return
		}
		var loaded bool
		c, loaded = r.notFound.LoadOrStore(domain, r.stats.Counter(statService+"rate_limit."+sanitizeStatName(domain)+".domain_not_found"))
		if !loaded {
			r.nNotFound.Add(1)
		}
	}
	c.(StatCounter).Add(uint64(descriptors))
}

// SendsStats reports whether the reference's stats also go to statsd: a
// caller can skip what only a statsd name needs.
func (m *Metrics) SendsStats() bool { return m != nil && m.ref.stats != nil }

// GlobalShadowMode counts a request over a limit answered OK because of
// --shadow-mode.
func (m *Metrics) GlobalShadowMode() {
	if m != nil {
		m.ref.globalShadowMode.add(1)
	}
}

// method returns the series of a gRPC method, labelled by its name alone
// (the reference's grpc_method; in statsd ratelimit_server.<name>.*).
// Methods are the server's registered ones: gRPC calls no handler for
// others.
func (r *referenceMetrics) method(fullMethod string) *methodSeries {
	if s, ok := r.methods.Load(fullMethod); ok {
		return s.(*methodSeries)
	}
	name := fullMethod[strings.LastIndexByte(fullMethod, '/')+1:]
	ms := &methodSeries{
		requests: r.counter(r.totalRequests.WithLabelValues(name), statServer+name+".total_requests"),
		duration: r.responseTime.WithLabelValues(name),
	}
	if r.stats != nil {
		ms.statDuration = r.stats.Timer(statServer + name + ".response_time")
	}
	s, _ := r.methods.LoadOrStore(fullMethod, ms)
	return s.(*methodSeries)
}

// UnaryServerInterceptor counts gRPC calls and their durations under the
// reference's total_requests and response_time, by method name.
func (m *Metrics) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		if m != nil {
			s := m.ref.method(info.FullMethod)
			took := time.Since(start)
			s.requests.add(1)
			s.duration.Observe(took.Seconds())
			if s.statDuration != nil {
				s.statDuration.AddValue(float64(took.Milliseconds())) // whole milliseconds, as the reference
			}
		}
		return resp, err
	}
}
