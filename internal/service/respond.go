package service

import (
	"math"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/metrics"
)

// From the limiter's verdicts to Envoy's answer: the overall code, each
// descriptor's status, headers and dynamic metadata.

// respond turns the verdicts into Envoy's answer. As the reference, the
// request is denied when any ordinary descriptor is over its limit, or when
// every quota-mode descriptor is (each keeps its own OVER_LIMIT status
// either way). When the store could not decide an enforced limit whose
// failure mode defers to Envoy, and the request is not denied, there is no
// answer to give: respond returns that limit as deferred, and the caller
// fails the request. A denial wins over deferring: the request is refused
// whatever the store would say. Under the global shadow mode a denied
// request is answered OK instead, its statuses as they are: shadowed
// reports it.
//
// The overall code is decided here per descriptor, from the limit each
// status shows, rather than taken from the limiter's rule on the hits
// (limiter's requestRule), which decides what is charged: under the global
// shadow mode every hit is a shadow one, yet the would-be denial must be
// shown and counted. On quotas the two agree: a descriptor with several
// quota limits shows a denial first, so it is over when any of them is, as
// the limiter's quota of its limits (one QuotaGroup) is.
func (s *Service) respond(domain string, limits []*limit, hits []limiter.Hit, verdicts []limiter.Verdict) (
	resp *rlsv3.RateLimitResponse, deferred *limit, shadowed bool,
) {
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
			if mv.FailureVerdict && m.failureMode == config.FailureDefer && s.enforced(m) && deferred == nil {
				deferred = m
			}
			if !mv.Admitted && !s.enforced(m) {
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
		// A shadow rule over its limit (remaining 0) may be the tightest,
		// as in the reference and in Envoy's x-ratelimit-* headers.
		if tightest < 0 || st.LimitRemaining < resp.Statuses[tightest].LimitRemaining {
			tightest = i
		}
	}
	if q.allOver() {
		// Waiting for the first quota to free up is enough for them.
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		retryAfter = max(retryAfter, q.firstFree)
	}
	switch {
	case resp.OverallCode == rlsv3.RateLimitResponse_OK:
	case s.opts.ShadowMode:
		// The reference's SHADOW_MODE turns only the overall code OK. No
		// retry-after: Envoy adds response_headers_to_add to the response
		// it lets through too, where a wait would be a false one.
		resp.OverallCode, shadowed = rlsv3.RateLimitResponse_OK, true
	default:
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
	return resp, deferred, shadowed
}

// enforced reports a limit whose denial denies: not a shadow rule, and not
// under the global shadow mode.
func (s *Service) enforced(l *limit) bool { return !l.shadow && !s.opts.ShadowMode }

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
	case !v.Admitted && !s.enforced(l):
		return metrics.ShadowWouldDeny
	case !v.Admitted:
		return metrics.OverLimit
	case float64(uint64(l.requestsPerUnit)-min(v.Remaining, uint64(l.requestsPerUnit))) >= s.opts.NearLimitRatio*float64(l.requestsPerUnit):
		return metrics.NearLimit
	}
	return metrics.WithinLimit
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
