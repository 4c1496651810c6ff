package service

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/rlqs"
)

// Envoy's Rate Limit Quota Service: each Envoy streams its usage per
// bucket, and is answered with an assignment per bucket (internal/rlqs),
// from the same config and counters as ShouldRateLimit.

// Bounds on what one stream may make the service hold.
const (
	// MaxRLQSBuckets bounds the buckets one stream reports: a report of
	// more is answered for the first ones; Envoy applies its
	// no_assignment_behavior to the others.
	MaxRLQSBuckets = 4096
	// MaxRLQSBucketsTotal bounds the buckets of all streams together, each
	// holding its id, lease and keys (about a kilobyte): many streams
	// cannot grow the service's memory past about 16 MiB this way.
	MaxRLQSBucketsTotal = 16384
	// rlqsParallel bounds the buckets of one report decided at once.
	rlqsParallel = 32
)

// RLQS implements rlqsv3.RateLimitQuotaServiceServer beside a Service.
type RLQS struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer

	svc      *Service
	alloc    *rlqs.Allocator
	instance string        // names this process's streams among the shares
	streams  atomic.Uint64 // numbers them
	buckets  atomic.Int64  // held by all streams, at most maxTotal
	maxTotal int64

	draining  chan struct{} // closed by Drain
	drainOnce sync.Once
}

// NewRLQS returns the quota service of s, assigning with alloc.
func NewRLQS(s *Service, alloc *rlqs.Allocator) *RLQS {
	var id [8]byte
	_, _ = rand.Read(id[:]) // never fails (crypto/rand)
	return &RLQS{svc: s, alloc: alloc, instance: hex.EncodeToString(id[:]), draining: make(chan struct{}), maxTotal: MaxRLQSBucketsTotal}
}

// rlqsBucket is one bucket of a stream.
type rlqsBucket struct {
	id    *rlqsv3.BucketId
	lease rlqs.Bucket
	lim   rlqs.Limit // as last leased
	// decided is when the bucket was last decided (zero: never); it is
	// decided again rlqs.MinReportGap later at the earliest.
	decided time.Time
	// The requests reported since it was last decided.
	allowed, denied uint64
	// Of the report being answered: queued to be decided, and its action.
	queued bool
	action *rlqsv3.RateLimitQuotaResponse_BucketAction
}

// StreamRateLimitQuotas answers each usage report with the assignments of
// its buckets. The stream lasts as long as Envoy keeps it, or until Drain;
// its buckets' leases end with it, their shares when their assignments
// expire.
func (q *RLQS) StreamRateLimitQuotas(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	member := q.instance + "." + strconv.FormatUint(q.streams.Add(1), 10)
	q.svc.opts.Metrics.RLQSStream(1)
	defer q.svc.opts.Metrics.RLQSStream(-1)
	ctx := stream.Context()
	// Recv blocks: it runs on its own, so that a drain ends the stream. It
	// ends when the stream does, which the handler's return ensures.
	reports, recvErr := make(chan *rlqsv3.RateLimitQuotaUsageReports), make(chan error, 1)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reports <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	buckets := map[string]*rlqsBucket{}
	defer func() { q.buckets.Add(-int64(len(buckets))) }()
	var domain string
	for {
		var r *rlqsv3.RateLimitQuotaUsageReports
		select {
		case r = <-reports:
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-q.draining:
			// Envoy opens a new stream at its next report, to another
			// instance; its assignments live until then.
			return nil
		}
		if r.Domain != "" {
			domain = r.Domain // the protocol sends it first; Envoy in every message
		}
		resp, sent := q.answer(ctx, member, domain, buckets, r)
		if len(resp.BucketAction) == 0 {
			continue
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		q.confirm(ctx, sent)
	}
}

// confirm tells the shares which buckets were sent smaller assignments
// than they held (rlqs.Allocator.Confirm), so that what they gave up goes
// to the other Envoys at their next report.
func (q *RLQS) confirm(ctx context.Context, sent []*rlqsBucket) {
	ctx, cancel := context.WithTimeout(ctx, rlqs.AnswerWithin)
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, rlqsParallel)
	for _, b := range sent {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			// A failure leaves the larger share until the bucket's next
			// report: the others wait a report longer.
			_ = q.alloc.Confirm(ctx, &b.lease, b.lim)
		})
	}
	wg.Wait()
}

// Drain ends every stream, and those opened later at once: a service
// about to stop sends its Envoys to the others.
func (q *RLQS) Drain() { q.drainOnce.Do(func() { close(q.draining) }) }

// answer decides the buckets of one report. Each report holds every
// bucket Envoy has (its domain in every message, as Envoy sends it).
func (q *RLQS) answer(ctx context.Context, member, domain string, buckets map[string]*rlqsBucket,
	reports *rlqsv3.RateLimitQuotaUsageReports,
) (*rlqsv3.RateLimitQuotaResponse, []*rlqsBucket) {
	// The answer goes within rlqs.AnswerWithin of the first share, which
	// outlives the assignment's time to live by that much.
	ctx, cancel := context.WithTimeout(ctx, rlqs.AnswerWithin)
	defer cancel()
	var todo []*rlqsBucket
	now := q.alloc.Now()
	for _, u := range reports.BucketQuotaUsages {
		if len(u.GetBucketId().GetBucket()) == 0 {
			continue // Envoy ignores an action for an empty id
		}
		key := bucketKey(u.BucketId.Bucket)
		b := buckets[key]
		if b == nil {
			if len(buckets) >= MaxRLQSBuckets || q.buckets.Add(1) > q.maxTotal {
				if len(buckets) < MaxRLQSBuckets {
					q.buckets.Add(-1)
				}
				continue // Envoy applies its no_assignment_behavior
			}
			b = &rlqsBucket{id: u.BucketId, lease: rlqs.Bucket{Member: member + "." + strconv.Itoa(len(buckets))}}
			buckets[key] = b
		}
		// Counts a client sends: added without wrapping.
		b.allowed = saturatingAdd(b.allowed, u.NumRequestsAllowed)
		b.denied = saturatingAdd(b.denied, u.NumRequestsDenied)
		if b.queued || !b.decided.IsZero() && now.Sub(b.decided) < rlqs.MinReportGap {
			// Once per report, however often it names the bucket; and a
			// bucket decided moments ago keeps its assignment, its counts
			// going to its next decision: a client reporting every 10 ms
			// costs the store what one reporting every second does.
			continue
		}
		b.queued = true
		b.action = &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: b.id}
		todo = append(todo, b)
	}
	cfg := q.svc.current.Load().config
	var wg sync.WaitGroup
	sem := make(chan struct{}, rlqsParallel)
	var failed atomic.Int64
	var lastErr atomic.Pointer[error]
	for _, b := range todo {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := q.decide(ctx, cfg, domain, b); err != nil {
				failed.Add(1)
				lastErr.Store(&err)
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 && ctx.Err() == nil {
		// Once per report, not per bucket: a report holds thousands.
		q.svc.log.Warn("rlqs: no lease for some buckets: their assignments run out at their time to live",
			zap.String("domain", domain), zap.Int64("buckets", n), zap.Error(*lastErr.Load()))
	}
	resp := &rlqsv3.RateLimitQuotaResponse{BucketAction: make([]*rlqsv3.RateLimitQuotaResponse_BucketAction, 0, len(todo))}
	var sent []*rlqsBucket
	for _, b := range todo {
		if b.action.BucketAction != nil {
			resp.BucketAction = append(resp.BucketAction, b.action)
			sent = append(sent, b)
		}
		b.decided, b.allowed, b.denied, b.action, b.queued = now, 0, 0, nil, false
	}
	return resp, sent
}

// decide fills b.action: the assignment of b's rule, or none when the store
// cannot lease, which it returns.
func (q *RLQS) decide(ctx context.Context, cfg *config.Config, domain string, b *rlqsBucket) error {
	l, entries := q.resolveBucket(cfg, domain, b.id.Bucket)
	if l == nil {
		q.svc.opts.Metrics.RLQSUnmatched()
		b.action.BucketAction = assignmentAction(q.alloc.Allow())
		return nil
	}
	var a rlqs.Assignment
	switch {
	case l.unlimited || l.shadow:
		a = q.alloc.Allow()
	case l.requestsPerUnit == 0:
		a = q.alloc.Deny()
	default:
		var err error
		b.lim = q.leaseLimit(domain, entries, l)
		a, err = q.alloc.Report(ctx, &b.lease, b.lim, b.allowed+b.denied)
		if err != nil {
			q.svc.opts.Metrics.RLQSReport(domain, l.label(), b.allowed, b.denied, "none")
			return err
		}
	}
	q.svc.opts.Metrics.RLQSReport(domain, l.label(), b.allowed, b.denied, kindLabel(a.Kind))
	b.action.BucketAction = assignmentAction(a)
	return nil
}

// resolveBucket finds the limit of a bucket id, and its entries in the
// order of the domain's tree (config.BucketEntries); nil when none applies.
func (q *RLQS) resolveBucket(cfg *config.Config, domain string, bucket map[string]string) (*limit,
	[]*rlcommon.RateLimitDescriptor_Entry,
) {
	ordered, ok := config.BucketEntries(cfg, domain, bucket)
	if !ok {
		return nil, nil
	}
	d := &rlcommon.RateLimitDescriptor{Entries: make([]*rlcommon.RateLimitDescriptor_Entry, len(ordered))}
	for i, e := range ordered {
		d.Entries[i] = &rlcommon.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value}
	}
	l, err := resolve(cfg, domain, d)
	if err != nil || l == nil {
		return nil, nil // no override in a bucket id: an error cannot happen
	}
	limits := []*limit{l}
	dropReplaced(limits)
	if limits[0] == nil {
		return nil, nil
	}
	return limits[0], d.Entries
}

// leaseLimit is what a bucket under l leases from: the counters of l and
// of its other limits, the one with the least rate first, whose shares
// are keyed in this service's schema whatever the algorithm's keys.
func (q *RLQS) leaseLimit(domain string, entries []*rlcommon.RateLimitDescriptor_Entry, l *limit) rlqs.Limit {
	kb := limiter.KeyBuilder{Prefix: q.svc.opts.KeyPrefix, Now: q.svc.opts.Now()}
	all := append([]*limit{l}, l.also...)
	slices.SortStableFunc(all, func(x, y *limit) int {
		// x's rate below y's: x.requests / x.window < y.requests / y.window.
		rx := float64(x.requestsPerUnit) / x.window().Seconds()
		ry := float64(y.requestsPerUnit) / y.window().Seconds()
		switch {
		case rx < ry:
			return -1
		case rx > ry:
			return 1
		}
		return 0
	})
	lim := rlqs.Limit{Hits: make([]limiter.Hit, len(all))}
	for i, each := range all {
		lim.Hits[i] = each.storeHit(&kb, domain, entries, 0)
	}
	gov := all[0]
	kb.Reset(domain)
	for i, e := range entries {
		if gov.rule != nil && i < len(gov.rule.Levels) && gov.rule.Levels[i].ShareThreshold {
			kb.AddShared(e.Key, gov.rule.Levels[i].Value)
			continue
		}
		kb.Add(e.Key, e.Value)
	}
	lim.ShareKey = kb.Key(gov.algorithm, gov.window()) + ":rlqs"
	return lim
}

// assignmentAction is Envoy's form of a.
func assignmentAction(a rlqs.Assignment) *rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_ {
	strategy := &typev3.RateLimitStrategy{}
	switch a.Kind {
	case rlqs.AllowAll:
		strategy.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}
	case rlqs.DenyAll:
		strategy.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}
	case rlqs.TokenBucket:
		strategy.Strategy = &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens:     uint32(min(a.MaxTokens, 1<<32-1)),
			TokensPerFill: wrapperspb.UInt32(uint32(min(a.TokensPerFill, 1<<32-1))),
			FillInterval:  durationpb.New(a.FillInterval),
		}}
	}
	return &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
		QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			// Envoy reads whole seconds: a lease is one.
			AssignmentTimeToLive: durationpb.New(a.TTL.Truncate(time.Second)),
			RateLimitStrategy:    strategy,
		},
	}
}

func kindLabel(k rlqs.Kind) string {
	switch k {
	case rlqs.DenyAll:
		return "deny_all"
	case rlqs.TokenBucket:
		return "token_bucket"
	}
	return "allow_all"
}

// bucketKey identifies a bucket id whatever the order of its map: its
// entries sorted by key, each length-prefixed so that no two ids meet.
func bucketKey(bucket map[string]string) string {
	keys := make([]string, 0, len(bucket))
	for k := range bucket {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b []byte
	for _, k := range keys {
		v := bucket[k]
		b = strconv.AppendInt(b, int64(len(k)), 10)
		b = append(append(b, ':'), k...)
		b = strconv.AppendInt(b, int64(len(v)), 10)
		b = append(append(b, ':'), v...)
	}
	return string(b)
}

// saturatingAdd is a+b, at most the largest uint64.
func saturatingAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}
