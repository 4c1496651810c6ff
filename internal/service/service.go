// Package service is the face of the rate limiter: it implements Envoy's
// envoy.service.ratelimit.v3.RateLimitService (service.go) and
// envoy.service.rate_limit_quota.v3.RateLimitQuotaService (rlqs.go). It validates a
// request (validate.go), matches each descriptor to the rules of the
// current config (resolve.go), asks the limiter for a decision on all of
// them at once, and turns the verdicts into Envoy's answer (respond.go).
// Around that: the same call as POST /json and the config as JSON and as
// the reference's /rlconfig text (http.go, rlconfig.go), the admin API
// (admin.go), envoyproxy/ratelimit's metrics (refmetrics.go), and Envoy's
// Rate Limit Quota Service (rlqs.go): usage reports per bucket answered with
// the assignments internal/rlqs leases from the same counters. It knows
// nothing of Redis; errors become gRPC status codes here and nowhere deeper.
// What the ports need around it, shedding past --max-inflight and the
// request codec, is internal/transport's, which this package does not
// import.
//
// Two things follow envoyproxy/ratelimit rather than Redis: under the
// global shadow mode (Options.ShadowMode) a denied request is answered OK
// with its statuses as they are, and the keys of an algorithm on the
// reference's keys name their window by Options.Now, read once per request,
// as the reference names them by its clock.
//
// The global modes (Options.ShadowMode, Options.QuotaMode) reach the limiter
// as per-hit Shadow and Quota flags, set in one place (applyModes); the
// limiter decides from them, with its one rule, what is charged.
package service

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
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
	// maximal requests at --max-inflight stays within the memory bound of
	// docs/reliability.md.
	DefaultMaxRequestBytes = 256 << 10

	// The reference's header names (LIMIT_LIMIT_HEADER and others).
	DefaultLimitHeader     = "RateLimit-Limit"
	DefaultRemainingHeader = "RateLimit-Remaining"
	DefaultResetHeader     = "RateLimit-Reset"
)

// Decider decides a request's hits. The service (internal/app) gives it
// the hot keys' *hotkeys.Slices over the *limiter.Split of the main and
// per-second stores, or, with --region, the regions' decider
// (internal/regions) over those slices; pkg/service a limiter directly
// (decision.Direct).
type Decider = decision.Decider

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
	// QuotaMode puts every descriptor in quota mode (set by the reference's
	// QUOTA_MODE): a request is denied only when all are over their limit.
	// The reference's quota mode never denies; this one keeps a limit.
	QuotaMode bool
	// ResponseDynamicMetadata fills every answer's dynamic_metadata (the
	// reference's RESPONSE_DYNAMIC_METADATA): the domain, the descriptors as
	// the reference sends them, and the metadata of the admitted
	// descriptors' rules, an extension; not the reference's quota fields.
	ResponseDynamicMetadata bool
	// ShadowMode is the reference's SHADOW_MODE: no request is denied. Each
	// descriptor's status stays what it would be (OVER_LIMIT included), only
	// the overall code is OK; each hit is counted on its own, as a shadow
	// rule's, and would-be denials are logged and counted.
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
	// Now is the clock that names the window of the keys in the
	// reference's schema (limiter.KeyBuilder.Now), read once per request;
	// nil means time.Now.
	Now func() time.Time
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
	if s.opts.Now == nil {
		s.opts.Now = time.Now
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
	s.opts.Metrics.RuleLimits(ruleLimits(cfg))
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
	s.opts.Metrics.RuleLimits(ruleLimits(cfg))
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

// ShouldRateLimit answers one Envoy rate limit request.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := s.validate(req); err != nil {
		s.opts.Metrics.InvalidRequest(err.(*invalidRequest).reason)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	cfg := s.current.Load().config
	limits := make([]*limit, len(req.Descriptors))
	for i, d := range req.Descriptors {
		// A settlement first: its lease entry must not make it a limit
		// override's throwaway counter.
		l := resolveSettlement(cfg, req.Domain, d)
		if l == nil {
			var err error
			if l, err = resolve(cfg, req.Domain, d); err != nil {
				s.opts.Metrics.InvalidRequest("bad_override")
				return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
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
	var routes []decision.Route
	kb := limiter.KeyBuilder{Prefix: s.opts.KeyPrefix, Now: s.opts.Now()}
	for i, l := range limits {
		if l == nil || l.unlimited {
			continue
		}
		d := req.Descriptors[i]
		l.hit = len(hits)
		hits = append(hits, l.costHit(&kb, req.Domain, d, requestCost))
		routes = withRoute(routes, l.hit, l.route(), cap(hits))
		for _, a := range l.also {
			a.hit = len(hits)
			hits = append(hits, a.costHit(&kb, req.Domain, d, requestCost))
			routes = withRoute(routes, a.hit, a.route(), cap(hits))
		}
		// A quota descriptor's limits are one quota: over on one of them,
		// it is charged on none, as its status says OVER_LIMIT.
		for j := l.hit; j < len(hits); j++ {
			hits[j].QuotaGroup = uint32(i)
		}
	}

	s.applyModes(limits, hits)

	var verdicts []limiter.Verdict
	var err error
	if len(hits) > 0 {
		// On a store error the verdicts follow each rule's failure mode; a
		// caller that gave up is no news of the store.
		verdicts, err = s.decider.Decide(ctx, decision.Request{Hits: hits, Routes: routes})
		switch {
		case err == nil || ctx.Err() != nil:
		case overloadOnly(err):
			s.log.Warn("overloaded: the deadline passed before the store was asked; applying failure modes",
				zap.String("domain", req.Domain))
		default:
			s.log.Warn("store unavailable: applying failure modes", zap.String("domain", req.Domain), zap.Error(err))
		}
	}
	resp, deferred, shadowed := s.respond(req.Domain, limits, hits, verdicts)
	if s.opts.ResponseDynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, limits, resp.Statuses)
	}
	leaseMetadata(resp, req, limits, verdicts)
	s.referenceMetrics(cfg, req, limits, hits, verdicts, shadowed)
	switch {
	case deferred == nil:
		return resp, nil
	case overloadOnly(err):
		// This instance, not the store, was too slow: the code Envoy gets
		// for an instance that sheds load, for its failure_mode_deny.
		return nil, status.Errorf(codes.ResourceExhausted,
			"overloaded: the deadline passed before the store was asked, and rule %s has no failure_mode", deferred)
	}
	// No answer to give: Envoy's failure_mode_deny decides, as it does for
	// envoyproxy/ratelimit when its Redis is down.
	return nil, status.Errorf(codes.Unavailable, "rate limit store unavailable, and rule %s has no failure_mode", deferred)
}

// withRoute adds hit i's route to routes, which stay nil (none routed)
// while every route is none: a request of plain rules allocates none.
func withRoute(routes []decision.Route, i int, r decision.Route, n int) []decision.Route {
	if routes == nil {
		if r == (decision.Route{}) {
			return nil
		}
		routes = make([]decision.Route, i, n)
	}
	return append(routes, r)
}

// applyModes maps the global modes onto a request's limits and their hits
// (limit.hit indexes hits; a descriptor without a limit, or unlimited, has
// none): the one place the service does. The limiter decides what denies the
// request from the per-hit flags alone, with its one rule. respond reads the
// modes again only to present the answer: the statuses stay what the rules
// say, and under ShadowMode a would-be denial is answered OK.
//
//   - QuotaMode (the reference's QUOTA_MODE) makes every limit a quota one,
//     and its hit a Quota hit.
//   - ShadowMode (the reference's SHADOW_MODE) makes every hit a Shadow one:
//     no hit denies its request, each is decided on its own, and none keeps
//     the others from being charged. The limits keep their own shadow mode,
//     so that respond still shows the denials in the statuses.
//   - A request whose quotas cannot deny it (quotaAlwaysPasses) has its
//     Quota hits go as Shadow hits, which never keep the others from being
//     charged.
func (s *Service) applyModes(limits []*limit, hits []limiter.Hit) {
	if s.opts.QuotaMode {
		for _, l := range limits {
			if l == nil {
				continue
			}
			for j := -1; j < len(l.also); j++ {
				each := l
				if j >= 0 {
					each = l.also[j]
				}
				each.quota = true
				if !l.unlimited { // an unlimited descriptor has no hits
					hits[each.hit].Quota = true
				}
			}
		}
	}
	if s.opts.ShadowMode {
		for i := range hits {
			hits[i].Shadow = true
		}
	}
	if quotaAlwaysPasses(limits, s.opts.QuotaMode) {
		for i := range hits {
			if hits[i].Quota {
				hits[i].Quota, hits[i].Shadow = false, true
			}
		}
	}
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
