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
	"slices"
	"strconv"
	"strings"
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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/metrics"
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

	// The reference's header names (LIMIT_LIMIT_HEADER and others).
	DefaultLimitHeader     = "RateLimit-Limit"
	DefaultRemainingHeader = "RateLimit-Remaining"
	DefaultResetHeader     = "RateLimit-Reset"
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
	// RateLimitHeaders adds the limit, remaining and reset headers (named
	// below) to every answer with a limited descriptor: the denying one
	// when the request is denied, else the one with the least remaining.
	RateLimitHeaders bool
	// LimitHeader, RemainingHeader and ResetHeader name those headers;
	// empty means the reference's names, DefaultLimitHeader and others.
	LimitHeader, RemainingHeader, ResetHeader string
	// QuotaMode puts every descriptor in quota mode (the reference's
	// QUOTA_MODE): a request is denied only when all are over their limit.
	QuotaMode bool
	// ResponseDynamicMetadata fills every answer's dynamic_metadata as the
	// reference's RESPONSE_DYNAMIC_METADATA does: the domain, the
	// descriptors, and the metadata of the admitted descriptors' rules.
	ResponseDynamicMetadata bool
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
	for _, h := range []struct {
		name *string
		def  string
	}{
		{&s.opts.LimitHeader, DefaultLimitHeader},
		{&s.opts.RemainingHeader, DefaultRemainingHeader},
		{&s.opts.ResetHeader, DefaultResetHeader},
	} {
		if *h.name == "" {
			*h.name = h.def
		}
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
	burst           uint32 // GCRA's bucket; 0: requestsPerUnit
	failureMode     config.FailureMode
	recordCosts     config.CostRecording
	shadow          bool
	quota           bool // quota_mode: denies only with every quota descriptor of the request
	unlimited       bool
	replaces        []string         // names of the limits this one drops
	metadata        *structpb.Struct // for dynamic_metadata; shared, never modified
	hit             int              // index into the request's hits, or -1
	// also holds the descriptor's other limits (rate_limits), each with a
	// counter and a hit of its own; the answer shows the tightest.
	also []*limit
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
		if l != nil && (s.opts.ShadowMode || s.opts.QuotaMode) {
			for j := -1; j < len(l.also); j++ {
				each := l
				if j >= 0 {
					each = l.also[j]
				}
				each.shadow = each.shadow || s.opts.ShadowMode
				each.quota = each.quota || s.opts.QuotaMode
			}
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
		l.hit = len(hits)
		hits = append(hits, l.costHit(&kb, req.Domain, d, requestCost))
		for _, a := range l.also {
			a.hit = len(hits)
			hits = append(hits, a.costHit(&kb, req.Domain, d, requestCost))
		}
	}

	if quotaAlwaysPasses(limits, s.opts.QuotaMode) {
		// The quotas cannot deny this request: their hits count as shadow
		// hits, which never keep the others from being charged.
		for i := range hits {
			if hits[i].Quota {
				hits[i].Quota, hits[i].Shadow = false, true
			}
		}
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
	if s.opts.ResponseDynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, limits, resp.Statuses)
	}
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

// quotaAlwaysPasses reports a request with a quota descriptor that passes
// whatever the store says (see respond): one without a limit under the
// global quota mode, or one whose limits are all in shadow mode.
func quotaAlwaysPasses(limits []*limit, globalQuota bool) bool {
	for _, l := range limits {
		switch {
		case l == nil:
			if globalQuota {
				return true
			}
		case !l.unlimited && l.quota && l.shadow:
			passes := true
			for _, a := range l.also {
				passes = passes && a.quota && a.shadow
			}
			if passes {
				return true
			}
		}
	}
	return false
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
// envoyproxy/ratelimit does, an override applies in any known domain, and
// keeps none of the rule's name, replaces, shadow or quota mode; it keeps
// this service's extensions: algorithm, failure mode, shared counters). It
// returns nil when no limit applies, as for a descriptor without entries,
// which the reference answers OK too.
func resolve(cfg *config.Config, domain string, d *rlcommon.RateLimitDescriptor) (*limit, error) {
	if len(d.Entries) == 0 {
		return nil, nil
	}
	rule := config.Match(cfg, domain, d.Entries)
	override := d.Limit
	if rule == nil && (override == nil || !cfg.HasDomain(domain)) {
		return nil, nil
	}
	var l *limit
	if rule != nil {
		l = ruleLimit(rule)
	} else {
		l = &limit{hit: -1}
		defaults := cfg.Defaults()
		l.algorithm, l.failureMode, l.recordCosts = defaults.Algorithm, defaults.FailureMode, defaults.RecordCosts
	}
	if override == nil {
		if all := rule.Limits(); len(all) > 1 {
			l.also = make([]*limit, len(all)-1)
			for i, r := range all[1:] {
				l.also[i] = ruleLimit(r)
			}
		}
		return l, nil
	}
	// An override replaces the rule's numbers: one limit, the override's.
	unit, ok := unitFromOverride(override.Unit)
	if !ok {
		return nil, fmt.Errorf("limit override has unit %v", override.Unit)
	}
	l.requestsPerUnit, l.unit, l.multiplier = override.RequestsPerUnit, unit, 1
	l.burst = 0 // a GCRA bucket sized for the rule's rate: the override's full window instead
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
	// As the reference, an override is a limit of its own: not the rule's
	// name, replaces, quota_mode, metadata, shadow_mode or unlimited.
	l.name, l.replaces, l.quota, l.metadata = "", nil, false, nil
	l.shadow, l.unlimited = false, false
	return l, nil
}

// ruleLimit is the limit a rule sets.
func ruleLimit(rule *config.Rule) *limit {
	return &limit{
		rule:            rule,
		name:            rule.Name,
		requestsPerUnit: rule.RequestsPerUnit,
		unit:            rule.Unit,
		multiplier:      rule.UnitMultiplier,
		algorithm:       rule.Algorithm,
		burst:           rule.Burst,
		failureMode:     rule.FailureMode,
		recordCosts:     rule.RecordCosts,
		shadow:          rule.ShadowMode,
		quota:           rule.QuotaMode,
		unlimited:       rule.Unlimited,
		replaces:        rule.Replaces,
		metadata:        rule.Metadata,
		hit:             -1,
	}
}

func (l *limit) window() time.Duration {
	return l.unit.Duration() * time.Duration(l.multiplier)
}

// dropReplaced removes the limits that another matched limit replaces
// (rate_limit.replaces), as envoyproxy/ratelimit does. Of a descriptor with
// several limits, only those replaced go. An unlimited limit never goes: the
// reference sets those aside before replaces apply, so it still answers as
// unlimited, and is no quota descriptor.
func dropReplaced(limits []*limit) {
	var replaced map[string]bool
	mark := func(l *limit) {
		if len(l.replaces) == 0 {
			return
		}
		if replaced == nil {
			replaced = map[string]bool{}
		}
		for _, name := range l.replaces {
			replaced[name] = true
		}
	}
	for _, l := range limits {
		if l == nil {
			continue
		}
		mark(l)
		for _, a := range l.also {
			mark(a)
		}
	}
	if replaced == nil {
		return
	}
	gone := func(l *limit) bool { return l.name != "" && !l.unlimited && replaced[l.name] }
	for i, l := range limits {
		if l == nil {
			continue
		}
		l.also = slices.DeleteFunc(l.also, gone)
		if gone(l) {
			limits[i] = nil
			if len(l.also) > 0 {
				limits[i], l.also[0].also = l.also[0], l.also[1:]
			}
		}
	}
}

// costHit is the limiter's hit for descriptor d of a request whose cost is
// requestCost. A descriptor's own hits_addend wins; with is_negative_hits the
// cost is given back. Whether a cost that does not fit is recorded anyway
// (a cost reported after it was spent) is the limit's record_costs.
func (l *limit) costHit(kb *limiter.KeyBuilder, domain string, d *rlcommon.RateLimitDescriptor, requestCost uint64) limiter.Hit {
	cost, fromDescriptor := requestCost, false
	if d.HitsAddend != nil {
		cost, fromDescriptor = d.HitsAddend.Value, true
	}
	if l.requestsPerUnit == 0 {
		// A zero limit admits nothing, not even a check of cost 0, and
		// keeps no count: the limiter denies a cost above the limit
		// without a store call, and charges no other descriptor of the
		// request.
		return l.storeHit(kb, domain, d.Entries, max(cost, 1))
	}
	h := l.storeHit(kb, domain, d.Entries, cost)
	h.Refund = d.IsNegativeHits
	// A check (cost 0) records nothing: it stays a plain hit, which the deny
	// cache may answer.
	h.Record = !h.Refund && cost > 0 && l.recordCosts.Records(fromDescriptor)
	return h
}

// storeHit is the limiter's hit for a descriptor under this limit.
func (l *limit) storeHit(kb *limiter.KeyBuilder, domain string, entries []*rlcommon.RateLimitDescriptor_Entry, cost uint64) limiter.Hit {
	return limiter.Hit{
		Key:       storeKey(kb, domain, entries, l),
		Algorithm: l.algorithm,
		Limit:     l.requestsPerUnit,
		Window:    l.window(),
		Cost:      cost,
		Burst:     l.burst,
		Shadow:    l.shadow,
		// A quota hit's denial alone does not deny its request: the limiter
		// charges the request when one of its quota hits fits.
		Quota:       l.quota,
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

// respond turns the verdicts into Envoy's answer. As the reference, the
// request is denied when any ordinary descriptor is over its limit, or when
// every quota-mode descriptor is (each keeps its own OVER_LIMIT status
// either way). When the store could not decide an enforced limit whose
// failure mode defers to Envoy, and the request is not denied, there is no
// answer to give: respond returns that limit as deferred, and the caller
// fails the request. A denial wins over deferring: the request is refused
// whatever the store would say.
func (s *Service) respond(domain string, limits []*limit, hits []limiter.Hit, verdicts []limiter.Verdict) (resp *rlsv3.RateLimitResponse, deferred *limit) {
	resp = &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(limits)),
	}
	var retryAfter time.Duration
	var q quotas
	tightest := -1           // the limited descriptor with the least remaining
	denying := -1            // the last ordinary descriptor over its limit
	var shownLimits []*limit // the limit each status shows, for the headers
	if s.opts.RateLimitHeaders {
		shownLimits = make([]*limit, len(limits))
	}
	for i, l := range limits {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		switch {
		case l == nil:
			// Under the global quota mode, a descriptor without a limit is
			// a quota descriptor that passes, as in the reference.
			q.count(i, s.opts.QuotaMode, true, 0)
			continue
		case l.unlimited:
			st.LimitRemaining = math.MaxUint32
			s.opts.Metrics.Decision(domain, l.label(), metrics.Unlimited)
			continue
		}
		// A descriptor with several limits shows the tightest: a denial,
		// the longest wait first; else the least remaining.
		shown, v := l, verdicts[l.hit]
		for j := -1; j < len(l.also); j++ {
			m := l
			if j >= 0 {
				m = l.also[j]
			}
			mv := verdicts[m.hit]
			if tighter(m, mv, shown, v) {
				shown, v = m, mv
			}
			s.opts.Metrics.Decision(domain, m.label(), s.outcome(m, mv))
			if mv.CostExceedsLimit && m.requestsPerUnit > 0 {
				s.log.Warn("cost exceeds the limit: denied without a store call",
					zap.String("domain", domain), zap.Stringer("rule", m), zap.Uint64("cost", hits[m.hit].Cost))
			}
			if mv.FailureVerdict && m.failureMode == config.FailureDefer && !m.shadow && deferred == nil {
				deferred = m
			}
			if !mv.Admitted && m.shadow {
				s.log.Info("shadow mode: would deny", zap.String("domain", domain), zap.Stringer("rule", m))
			}
		}
		if shownLimits != nil {
			shownLimits[i] = shown
		}
		st.CurrentLimit = shown.currentLimit()
		st.LimitRemaining = uint32(min(v.Remaining, math.MaxUint32))
		st.DurationUntilReset = durationpb.New(v.ResetAfter)
		if !v.Admitted {
			// The remaining of a denial is 0, as the reference answers,
			// even when fewer units than the cost are left.
			st.LimitRemaining = 0
			switch {
			case shown.shadow: // tighter shows an enforced denial first: none denies
			case shown.quota:
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			default:
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
				retryAfter = max(retryAfter, v.ResetAfter)
				denying = i
			}
		}
		q.count(i, shown.quota, st.Code == rlsv3.RateLimitResponse_OK, v.ResetAfter)
		// Shadow rules never limit, so they never are the tightest.
		if !shown.shadow && (tightest < 0 || st.LimitRemaining < resp.Statuses[tightest].LimitRemaining) {
			tightest = i
		}
	}
	if q.allOver() {
		// Waiting for the first quota to free up is enough for them.
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		retryAfter = max(retryAfter, q.firstFree)
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			header("retry-after", strconv.FormatInt(ceilSeconds(retryAfter), 10)))
	}
	switch {
	case denying >= 0:
		tightest = denying // the reference's rule: the headers tell why the request was denied
	case q.allOver():
		tightest = q.firstFreeAt
	}
	if s.opts.RateLimitHeaders && tightest >= 0 {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, s.rateLimitHeaders(shownLimits[tightest], resp.Statuses[tightest])...)
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		deferred = nil
	}
	return resp, deferred
}

// quotas tallies a request's quota-mode descriptors.
type quotas struct {
	total, over int
	firstFree   time.Duration // the shortest wait among those over
	firstFreeAt int           // the descriptor it is of
}

// count adds descriptor i if it is in quota mode; passed reports its
// status OK, wait its time until it would fit again.
func (q *quotas) count(i int, quota, passed bool, wait time.Duration) {
	switch {
	case !quota:
	case passed:
		q.total++
	default:
		if q.over == 0 || wait < q.firstFree {
			q.firstFree, q.firstFreeAt = wait, i
		}
		q.total++
		q.over++
	}
}

// allOver reports a request with quota descriptors, all over their limit.
func (q *quotas) allOver() bool { return q.total > 0 && q.over == q.total }

// tighter reports whether limit a with verdict va is to be shown rather than
// b with vb, of one descriptor: an enforced denial before anything else, the
// longer wait first (the request passes only when every limit fits); else
// the least remaining.
func tighter(a *limit, va limiter.Verdict, b *limit, vb limiter.Verdict) bool {
	aDenied, bDenied := !va.Admitted && !a.shadow, !vb.Admitted && !b.shadow
	switch {
	case aDenied != bDenied:
		return aDenied
	case aDenied:
		return va.ResetAfter > vb.ResetAfter
	}
	return va.Remaining < vb.Remaining
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

// rateLimitHeaders renders the reference's headers for one descriptor: its
// requests_per_unit, its remaining, and the whole seconds until its reset.
func (s *Service) rateLimitHeaders(l *limit, st *rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	reset := int64(0)
	if d := st.DurationUntilReset.AsDuration(); d > 0 {
		reset = ceilSeconds(d)
	}
	return []*corev3.HeaderValue{
		header(s.opts.LimitHeader, strconv.FormatUint(uint64(l.requestsPerUnit), 10)),
		header(s.opts.RemainingHeader, strconv.FormatUint(uint64(st.LimitRemaining), 10)),
		header(s.opts.ResetHeader, strconv.FormatInt(reset, 10)),
	}
}

// dynamicMetadata builds an answer's dynamic_metadata as the reference
// does: the domain, each descriptor's entries ("key=value"), limit override
// and hits_addend, the request's hits_addend, and under "metadata" the
// metadata of the rules of the descriptors answered OK (not unlimited, not
// replaced), merged in request order: a nested mapping merges, and
// otherwise the first descriptor to set a field wins. Keys and values are
// any bytes, and a protobuf string must be UTF-8: invalid bytes become
// U+FFFD, so that what a client sends never fails the answer.
func dynamicMetadata(req *rlsv3.RateLimitRequest, limits []*limit, statuses []*rlsv3.RateLimitResponse_DescriptorStatus) *structpb.Struct {
	descriptors := make([]*structpb.Value, len(req.Descriptors))
	for i, d := range req.Descriptors {
		entries := make([]*structpb.Value, len(d.Entries))
		for j, e := range d.Entries {
			entries[j] = structpb.NewStringValue(strings.ToValidUTF8(e.Key+"="+e.Value, "\uFFFD"))
		}
		fields := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if d.Limit != nil {
			fields["limit"] = structpb.NewStringValue(d.Limit.String())
		}
		if d.HitsAddend != nil {
			fields["hitsAddend"] = structpb.NewNumberValue(float64(d.HitsAddend.Value))
		}
		descriptors[i] = structpb.NewStructValue(&structpb.Struct{Fields: fields})
	}
	fields := map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(strings.ToValidUTF8(req.Domain, "\uFFFD")),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descriptors}),
	}
	if req.HitsAddend != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(req.HitsAddend))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i, l := range limits {
		if l != nil && !l.unlimited && l.metadata != nil && statuses[i].Code == rlsv3.RateLimitResponse_OK {
			mergeMetadata(passed, l.metadata)
		}
	}
	if len(passed.Fields) > 0 {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: fields}
}

// mergeMetadata adds src's fields to dest, merging mappings present in both.
// What it adds is a copy: src belongs to the config, shared by every answer.
func mergeMetadata(dest, src *structpb.Struct) {
	for k, v := range src.Fields {
		d, ok := dest.Fields[k]
		if !ok {
			dest.Fields[k] = proto.CloneOf(v)
			continue
		}
		if ds, ss := d.GetStructValue(), v.GetStructValue(); ds != nil && ss != nil {
			mergeMetadata(ds, ss)
		}
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
