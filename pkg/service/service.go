// Package service is the gRPC face of the rate limiter: it implements
// Envoy's envoy.service.ratelimit.v3.RateLimitService. It validates a
// request, matches each descriptor to a rule of the current config, asks the
// limiter for a decision on all of them at once, and turns the verdicts into
// Envoy's answer. It knows nothing of Redis; errors become gRPC status codes
// here and nowhere deeper.
package service

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit/pkg/config"
	"github.com/slidingwindow/ratelimit/pkg/limiter"
	"github.com/slidingwindow/ratelimit/pkg/metrics"
)

// Default bounds on a request, used where Options leave them zero.
const (
	DefaultMaxDescriptors = 64
	DefaultMaxEntries     = 32
	// DefaultMaxRequestBytes bounds a request message (gRPC) or body
	// (POST /json). Envoy's requests carry header values, and Envoy takes
	// 60 KiB of headers by default (max_request_headers_kb): this holds
	// several descriptors that copy one maximal header, while a flood of
	// maximal requests at --max-inflight stays within the memory bound the
	// README states.
	DefaultMaxRequestBytes = 256 << 10
)

// Decider decides a request's hits; *limiter.Limiter is the implementation.
type Decider interface {
	Decide(ctx context.Context, hits []limiter.Hit) ([]limiter.Verdict, error)
}

// Options configure a Service. A nil *Options means the defaults.
type Options struct {
	// MaxDescriptors bounds the descriptors of one request.
	MaxDescriptors int
	// MaxEntries bounds the entries of one descriptor.
	MaxEntries int
	// MaxRequestBytes bounds the body of POST /json; the gRPC server is
	// given the same bound with grpc.MaxRecvMsgSize.
	MaxRequestBytes int
	// RateLimitHeaders adds x-ratelimit-limit, -remaining and -reset to
	// every answer, taken from the most restrictive descriptor.
	RateLimitHeaders bool
	// ShadowMode puts every rule in shadow mode: answers are always OK,
	// counting goes on as usual, would-be denials are logged and counted.
	ShadowMode bool
	// NearLimitRatio is the share of a limit in use from which an admitted
	// decision counts as near_limit in metrics; zero means 0.8.
	NearLimitRatio float64
	// Logger receives would-deny, failure-mode and refused-cost events;
	// nil means no logging.
	Logger *zap.Logger
	// Metrics records decisions, refusals and config generations; nil
	// records nothing.
	Metrics *metrics.Metrics
	// KeyPrefix goes before every store key (limiter.KeyBuilder.Prefix).
	KeyPrefix string
}

// Service implements rlsv3.RateLimitServiceServer.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	current atomic.Pointer[snapshot]
	decider Decider
	opts    Options
	log     *zap.Logger

	reloadMu      sync.Mutex
	lastReloadErr *reloadError
}

// snapshot is a config in force, numbered by generation.
type snapshot struct {
	config     *config.Config
	generation uint64
	loadedAt   time.Time
}

type reloadError struct {
	err error
	at  time.Time
}

// New returns a Service answering from cfg with decider.
func New(cfg *config.Config, decider Decider, opts *Options) *Service {
	s := &Service{decider: decider}
	if opts != nil {
		s.opts = *opts
	}
	if s.opts.MaxDescriptors <= 0 {
		s.opts.MaxDescriptors = DefaultMaxDescriptors
	}
	if s.opts.MaxEntries <= 0 {
		s.opts.MaxEntries = DefaultMaxEntries
	}
	if s.opts.MaxRequestBytes <= 0 {
		s.opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if s.opts.NearLimitRatio <= 0 {
		s.opts.NearLimitRatio = 0.8
	}
	s.log = s.opts.Logger
	if s.log == nil {
		s.log = zap.NewNop()
	}
	s.current.Store(&snapshot{config: cfg, generation: 1, loadedAt: time.Now()})
	s.opts.Metrics.ConfigLoaded(1, cfg.Hash(), "", "")
	return s
}

// Reload puts cfg in force atomically, unless it is the config already in
// force; it reports whether it did. Requests in flight finish with the
// config they started with. Counters do not depend on the config's
// numbers, so a changed limit applies to the next decision on the same
// window history.
func (s *Service) Reload(cfg *config.Config) bool {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	prev := s.current.Load()
	if prev.config.Hash() == cfg.Hash() {
		s.opts.Metrics.ConfigReload("unchanged")
		s.lastReloadErr = nil // a bad write was reverted: nothing is wrong now
		return false
	}
	next := &snapshot{config: cfg, generation: prev.generation + 1, loadedAt: time.Now()}
	s.current.Store(next)
	s.lastReloadErr = nil
	s.opts.Metrics.ConfigLoaded(next.generation, cfg.Hash(), prev.config.Hash(), "success")
	s.log.Info("config reloaded", zap.Uint64("generation", next.generation), zap.String("hash", cfg.Hash()),
		zap.Int("rules", len(cfg.Rules())))
	return true
}

// ReloadFailed records a config that could not be loaded: the config in
// force stays, and the error is shown by the config endpoint until the next
// successful reload.
func (s *Service) ReloadFailed(err error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	s.lastReloadErr = &reloadError{err: err, at: time.Now()}
	s.opts.Metrics.ConfigReload("failure")
	s.log.Error("config reload failed: keeping the config in force", zap.Error(err))
}

// limit is what applies to one descriptor of a request.
type limit struct {
	rule            *config.Rule // nil for an override in a domain without a matching rule
	name            string
	requestsPerUnit uint32
	unit            config.Unit
	multiplier      uint32
	algorithm       config.Algorithm
	failureMode     config.FailureMode
	shadow          bool
	unlimited       bool
	hit             int // index into the request's hits, or -1
}

// ShouldRateLimit answers one Envoy rate limit request.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := s.validate(req); err != nil {
		s.opts.Metrics.InvalidRequest(err.(*invalidRequest).reason)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	cfg := s.current.Load().config
	limits := make([]*limit, len(req.Descriptors))
	for i, d := range req.Descriptors {
		l, err := resolve(cfg, req.Domain, d)
		if err != nil {
			s.opts.Metrics.InvalidRequest("bad_override")
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
		}
		if l != nil && s.opts.ShadowMode {
			l.shadow = true
		}
		limits[i] = l
	}
	dropReplaced(limits)

	requestCost := uint64(req.HitsAddend)
	if requestCost == 0 {
		requestCost = 1
	}
	hits := make([]limiter.Hit, 0, len(limits))
	kb := limiter.KeyBuilder{Prefix: s.opts.KeyPrefix}
	for i, l := range limits {
		if l == nil || l.unlimited {
			continue
		}
		d := req.Descriptors[i]
		cost := requestCost
		if d.HitsAddend != nil {
			cost = d.HitsAddend.Value
		}
		l.hit = len(hits)
		hits = append(hits, l.storeHit(&kb, req.Domain, d.Entries, cost))
	}

	var verdicts []limiter.Verdict
	var err error
	if len(hits) > 0 {
		// On a store error the verdicts follow each rule's failure mode; a
		// caller that gave up is no news of the store.
		verdicts, err = s.decider.Decide(ctx, hits)
		switch {
		case err == nil || ctx.Err() != nil:
		case overloadOnly(err):
			s.log.Warn("overloaded: the deadline passed before the store was asked; applying failure modes",
				zap.String("domain", req.Domain))
		default:
			s.log.Warn("store unavailable: applying failure modes", zap.String("domain", req.Domain), zap.Error(err))
		}
	}
	resp, deferred := s.respond(req.Domain, limits, hits, verdicts)
	s.referenceMetrics(req, limits, hits, verdicts, resp)
	switch {
	case deferred == nil:
		return resp, nil
	case overloadOnly(err):
		// This instance, not the store, was too slow: the code Envoy gets
		// for an instance that sheds load, for its failure_mode_deny.
		return nil, status.Errorf(codes.ResourceExhausted, "overloaded: the deadline passed before the store was asked, and rule %s has no failure_mode", deferred)
	}
	// No answer to give: Envoy's failure_mode_deny decides, as it does for
	// envoyproxy/ratelimit when its Redis is down.
	return nil, status.Errorf(codes.Unavailable, "rate limit store unavailable, and rule %s has no failure_mode", deferred)
}

// overloadOnly reports a Decide error that is an overload alone: across
// Redis Cluster slots one group may have been overloaded and another met a
// store failure, and then the store is at fault.
func overloadOnly(err error) bool {
	return errors.Is(err, limiter.ErrOverloaded) && !errors.Is(err, limiter.ErrStore)
}

// invalidRequest is a refused request: reason labels the metric, msg tells
// the caller what to fix.
type invalidRequest struct {
	reason string
	msg    string
}

func (e *invalidRequest) Error() string { return e.msg }

func invalid(reason, format string, args ...any) *invalidRequest {
	return &invalidRequest{reason: reason, msg: fmt.Sprintf(format, args...)}
}

// validate checks req against the bounds the operator controls (the
// descriptors and entries of Envoy's rate limit actions) and the fields
// Envoy always sets; its errors are *invalidRequest. What a client controls,
// the values, never fails a request: any length (within the message bound)
// and any bytes are limited like others.
func (s *Service) validate(req *rlsv3.RateLimitRequest) error {
	switch {
	case req.Domain == "":
		return invalid("empty_domain", "domain is empty")
	case len(req.Descriptors) == 0:
		return invalid("no_descriptors", "request has no descriptors")
	case len(req.Descriptors) > s.opts.MaxDescriptors:
		// The codec stops decoding at one past the bound: the count is not
		// known.
		return invalid("too_many_descriptors", "request has more than the limit of %d descriptors", s.opts.MaxDescriptors)
	}
	for i, d := range req.Descriptors {
		switch {
		case len(d.Entries) > s.opts.MaxEntries:
			return invalid("too_many_entries", "descriptor %d has more than the limit of %d entries", i, s.opts.MaxEntries)
		case d.IsNegativeHits:
			return invalid("negative_hits", "descriptor %d: is_negative_hits is not supported", i)
		}
		for j, e := range d.Entries {
			if e.Key == "" {
				return invalid("empty_key", "descriptor %d entry %d has an empty key", i, j)
			}
		}
	}
	return nil
}

// resolve finds the limit for a descriptor: the matching rule, replaced in
// its numbers by the descriptor's own limit override when it has one (as
// envoyproxy/ratelimit does, an override applies in any known domain and is
// never in shadow mode). It returns nil when no limit applies, as for a
// descriptor without entries, which the reference answers OK too.
func resolve(cfg *config.Config, domain string, d *rlcommon.RateLimitDescriptor) (*limit, error) {
	if len(d.Entries) == 0 {
		return nil, nil
	}
	rule := config.Match(cfg, domain, d.Entries)
	override := d.Limit
	if rule == nil && (override == nil || !cfg.HasDomain(domain)) {
		return nil, nil
	}
	l := &limit{rule: rule, hit: -1}
	if rule != nil {
		*l = limit{
			rule:            rule,
			name:            rule.Name,
			requestsPerUnit: rule.RequestsPerUnit,
			unit:            rule.Unit,
			multiplier:      rule.UnitMultiplier,
			algorithm:       rule.Algorithm,
			failureMode:     rule.FailureMode,
			shadow:          rule.ShadowMode,
			unlimited:       rule.Unlimited,
			hit:             -1,
		}
	} else {
		defaults := cfg.Defaults()
		l.algorithm, l.failureMode = defaults.Algorithm, defaults.FailureMode
	}
	if override == nil {
		return l, nil
	}
	unit, ok := unitFromOverride(override.Unit)
	if !ok {
		return nil, fmt.Errorf("limit override has unit %v", override.Unit)
	}
	l.requestsPerUnit, l.unit, l.multiplier = override.RequestsPerUnit, unit, 1
	if m := override.UnitMultiplier; m != nil {
		// Compared before multiplying, which could overflow.
		if m.Value == 0 || time.Duration(m.Value) > config.MaxWindow/unit.Duration() {
			return nil, fmt.Errorf("limit override unit_multiplier %d: the window must be 1 unit to %v", m.Value, config.MaxWindow)
		}
		l.multiplier = m.Value
	}
	if l.algorithm == config.SlidingWindowLog && l.requestsPerUnit > config.MaxLogLimit {
		return nil, fmt.Errorf("limit override of %d is above the sliding_window_log maximum of %d", l.requestsPerUnit, config.MaxLogLimit)
	}
	l.shadow, l.unlimited = false, false
	return l, nil
}

func (l *limit) window() time.Duration {
	return l.unit.Duration() * time.Duration(l.multiplier)
}

// dropReplaced removes the limits that another matched limit replaces
// (rate_limit.replaces), as envoyproxy/ratelimit does.
func dropReplaced(limits []*limit) {
	var replaced map[string]bool
	for _, l := range limits {
		if l == nil || l.rule == nil || len(l.rule.Replaces) == 0 {
			continue
		}
		if replaced == nil {
			replaced = map[string]bool{}
		}
		for _, name := range l.rule.Replaces {
			replaced[name] = true
		}
	}
	if replaced == nil {
		return
	}
	for i, l := range limits {
		if l != nil && l.name != "" && replaced[l.name] {
			limits[i] = nil
		}
	}
}

// storeHit is the limiter's hit for a descriptor under this limit.
func (l *limit) storeHit(kb *limiter.KeyBuilder, domain string, entries []*rlcommon.RateLimitDescriptor_Entry, cost uint64) limiter.Hit {
	return limiter.Hit{
		Key:         storeKey(kb, domain, entries, l),
		Algorithm:   l.algorithm,
		Limit:       l.requestsPerUnit,
		Window:      l.window(),
		Cost:        cost,
		Shadow:      l.shadow,
		FailureMode: l.failureMode,
	}
}

// storeKey names the counter of a descriptor. Entries matched by a
// share_threshold wildcard contribute the pattern, so that all their values
// share one counter.
func storeKey(kb *limiter.KeyBuilder, domain string, entries []*rlcommon.RateLimitDescriptor_Entry, l *limit) string {
	kb.Reset(domain)
	for i, e := range entries {
		if l.rule != nil && i < len(l.rule.Levels) && l.rule.Levels[i].ShareThreshold {
			kb.AddShared(e.Key, l.rule.Levels[i].Value)
			continue
		}
		kb.Add(e.Key, e.Value)
	}
	return kb.Key(l.algorithm, l.window())
}

// respond turns the verdicts into Envoy's answer. When the store could not
// decide an enforced limit whose failure mode defers to Envoy, and no
// enforced limit denies the request, there is no answer to give: respond
// returns that limit as deferred, and the caller fails the request. A denial
// wins over deferring: the request is refused whatever the store would say.
func (s *Service) respond(domain string, limits []*limit, hits []limiter.Hit, verdicts []limiter.Verdict) (resp *rlsv3.RateLimitResponse, deferred *limit) {
	resp = &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(limits)),
	}
	var retryAfter time.Duration
	tightest := -1 // the limited descriptor with the least remaining
	for i, l := range limits {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		switch {
		case l == nil:
			continue
		case l.unlimited:
			st.LimitRemaining = math.MaxUint32
			s.opts.Metrics.Decision(domain, l.label(), metrics.Unlimited)
			continue
		}
		v := verdicts[l.hit]
		s.opts.Metrics.Decision(domain, l.label(), s.outcome(l, v))
		st.CurrentLimit = l.currentLimit()
		st.LimitRemaining = uint32(min(v.Remaining, math.MaxUint32))
		st.DurationUntilReset = durationpb.New(v.ResetAfter)
		if v.CostExceedsLimit {
			s.log.Warn("cost exceeds the limit: denied without a store call",
				zap.String("domain", domain), zap.Stringer("rule", l), zap.Uint64("cost", hits[l.hit].Cost))
		}
		if v.FailureVerdict && l.failureMode == config.FailureDefer && !l.shadow && deferred == nil {
			deferred = l
		}
		if !v.Admitted {
			if l.shadow {
				s.log.Info("shadow mode: would deny", zap.String("domain", domain), zap.Stringer("rule", l))
			} else {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
				retryAfter = max(retryAfter, v.ResetAfter)
			}
		}
		// Shadow rules never limit, so they never are the tightest.
		if !l.shadow && (tightest < 0 || st.LimitRemaining < resp.Statuses[tightest].LimitRemaining) {
			tightest = i
		}
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			header("retry-after", strconv.FormatInt(ceilSeconds(retryAfter), 10)))
	}
	if s.opts.RateLimitHeaders && tightest >= 0 {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, rateLimitHeaders(limits[tightest], resp.Statuses[tightest])...)
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		deferred = nil
	}
	return resp, deferred
}

// outcome classifies a decision for metrics.
func (s *Service) outcome(l *limit, v limiter.Verdict) metrics.Outcome {
	switch {
	case v.FailureVerdict && !v.Admitted:
		return metrics.FailureDeny
	case v.FailureVerdict && l.failureMode == config.FailureDefer:
		return metrics.FailureDefer
	case v.FailureVerdict:
		return metrics.FailureAllow
	case !v.Admitted && l.shadow:
		return metrics.ShadowWouldDeny
	case !v.Admitted:
		return metrics.OverLimit
	case float64(uint64(l.requestsPerUnit)-min(v.Remaining, uint64(l.requestsPerUnit))) >= s.opts.NearLimitRatio*float64(l.requestsPerUnit):
		return metrics.NearLimit
	}
	return metrics.WithinLimit
}

// label names the limit in metrics: the rule's name, else its path; both
// come from the config, so the label set stays bounded.
func (l *limit) label() string {
	switch {
	case l.rule == nil:
		return "override"
	case l.rule.Name != "":
		return l.rule.Name
	}
	return l.rule.Path()
}

// String names the limit in logs.
func (l *limit) String() string {
	if l.rule != nil {
		return l.rule.String()
	}
	return "limit override"
}

func (l *limit) currentLimit() *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{
		Name:            l.name,
		RequestsPerUnit: l.requestsPerUnit,
		Unit:            unitToEnvoy(l.unit),
	}
	if l.multiplier > 1 {
		rl.UnitMultiplier = wrapperspb.UInt32(l.multiplier)
	}
	return rl
}

// ceilSeconds rounds up to whole seconds, at least 1: Retry-After has no
// fractions, and 0 would invite an immediate, futile retry.
func ceilSeconds(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
}

// rateLimitHeaders renders the draft-03 headers Envoy itself would add, for
// callers that do not run Envoy's enable_x_ratelimit_headers.
func rateLimitHeaders(l *limit, st *rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	policy := fmt.Sprintf("%d, %d;w=%d", l.requestsPerUnit, l.requestsPerUnit, int64(l.window()/time.Second))
	if l.name != "" {
		policy += fmt.Sprintf(";name=%q", l.name)
	}
	reset := int64(0)
	if d := st.DurationUntilReset.AsDuration(); d > 0 {
		reset = ceilSeconds(d)
	}
	return []*corev3.HeaderValue{
		header("x-ratelimit-limit", policy),
		header("x-ratelimit-remaining", strconv.FormatUint(uint64(st.LimitRemaining), 10)),
		header("x-ratelimit-reset", strconv.FormatInt(reset, 10)),
	}
}

func header(key, value string) *corev3.HeaderValue {
	return &corev3.HeaderValue{Key: key, Value: value}
}

var envoyUnits = map[config.Unit]rlsv3.RateLimitResponse_RateLimit_Unit{
	config.Second: rlsv3.RateLimitResponse_RateLimit_SECOND,
	config.Minute: rlsv3.RateLimitResponse_RateLimit_MINUTE,
	config.Hour:   rlsv3.RateLimitResponse_RateLimit_HOUR,
	config.Day:    rlsv3.RateLimitResponse_RateLimit_DAY,
	config.Week:   rlsv3.RateLimitResponse_RateLimit_WEEK,
	config.Month:  rlsv3.RateLimitResponse_RateLimit_MONTH,
	config.Year:   rlsv3.RateLimitResponse_RateLimit_YEAR,
}

func unitToEnvoy(u config.Unit) rlsv3.RateLimitResponse_RateLimit_Unit { return envoyUnits[u] }

// unitFromOverride maps the unit of a descriptor's limit override.
func unitFromOverride(u typev3.RateLimitUnit) (config.Unit, bool) {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return config.Second, true
	case typev3.RateLimitUnit_MINUTE:
		return config.Minute, true
	case typev3.RateLimitUnit_HOUR:
		return config.Hour, true
	case typev3.RateLimitUnit_DAY:
		return config.Day, true
	case typev3.RateLimitUnit_MONTH:
		return config.Month, true
	case typev3.RateLimitUnit_YEAR:
		return config.Year, true
	}
	return 0, false
}
