package envoyrlqs

import (
	"context"
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
)

// DefaultReportInterval is Envoy's report period, hard-coded whatever the
// filter's reporting_interval says (filter_persistence.cc initTlsStore).
const DefaultReportInterval = 5 * time.Second

// Options is what one Envoy's filter config says, for one domain.
type Options struct {
	Domain string
	// ReportInterval is the period of the usage reports; 0 means
	// DefaultReportInterval, Envoy's.
	ReportInterval time.Duration
	// NoAssignment is no_assignment_behavior.fallback_rate_limit, the default
	// action of every bucket; nil means ALLOW_ALL. A token bucket here crashes
	// Envoy (F shouldAllowRequest consumes from a limiter never made), so New
	// refuses it.
	NoAssignment *typev3.RateLimitStrategy
	// Expired is expired_assignment_behavior.fallback_rate_limit; nil: none,
	// an expired assignment goes straight back to the default.
	Expired *typev3.RateLimitStrategy
	// ExpiredTimeout is expired_assignment_behavior_timeout: how long Expired
	// applies, read in whole seconds; 0 ends it at once, as in Envoy.
	ExpiredTimeout time.Duration
	// Now is the clock of the token buckets and of time_elapsed (Envoy's
	// monotonic time source); nil means time.Now.
	Now func() time.Time
}

// Client is one Envoy process's RLQS client for one domain. Allow may be
// called from many goroutines; everything else Envoy does on its main thread
// happens on the client's own goroutine.
type Client struct {
	rlqs               rlqspb.RateLimitQuotaServiceClient
	domain             string
	interval           time.Duration
	now                func() time.Time
	epoch              time.Time
	defaultStrategy    *typev3.RateLimitStrategy
	noAssignmentAllows bool
	fallback           *typev3.RateLimitStrategy
	fallbackTTL        time.Duration

	// cache is the workers' copy of the buckets (Envoy's TLS), replaced
	// whole by the main goroutine after every change (GC writeBucketsToTLS).
	cache atomic.Pointer[map[string]*cachedBucket]

	queueMu sync.Mutex
	queue   []func()
	wake    chan struct{}

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	stats  counters

	// The main goroutine's, as Envoy's main thread's.
	buckets      map[string]*cachedBucket
	stream       rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	streamCancel context.CancelFunc
	streamTried  bool
	reportTimer  *time.Timer
	expiries     expiryHeap
	expiryTimer  *time.Timer
}

// cachedBucket is GC's CachedBucket: immutable but for the usage counters and
// the limiter's state; every change makes a new one.
type cachedBucket struct {
	id    map[string]string
	usage *usage
	// action is the strategy in force; nil: the default (NoAssignment). An
	// empty strategy is an action with neither assignment nor abandon.
	action  *typev3.RateLimitStrategy
	from    Source
	limiter *tokenBucket // set when action is a token bucket
	expires time.Time    // when action's timer fires (real time); zero for the default
	created int          // token buckets made for this bucket so far
}

// usage is GC's QuotaUsage, shared by a bucket's successive cachedBuckets.
type usage struct {
	allowed, denied atomic.Uint64
	lastReport      time.Time // the main goroutine's
}

// ErrNoAssignmentTokenBucket is New's error for a token bucket as
// no_assignment_behavior, which crashes Envoy at a bucket's second request.
var ErrNoAssignmentTokenBucket = errors.New("envoyrlqs: a token bucket as no_assignment_behavior crashes Envoy at a bucket's second request")

// New returns the client of one Envoy for opts.Domain, speaking to the
// RateLimitQuotaService behind conn. Nothing is sent until the first Allow.
// A token bucket as opts.NoAssignment is refused (see Options).
func New(conn grpc.ClientConnInterface, opts Options) (*Client, error) {
	if opts.NoAssignment.GetTokenBucket() != nil {
		return nil, ErrNoAssignmentTokenBucket
	}
	c := &Client{
		rlqs:            rlqspb.NewRateLimitQuotaServiceClient(conn),
		domain:          opts.Domain,
		interval:        opts.ReportInterval,
		now:             opts.Now,
		defaultStrategy: opts.NoAssignment,
		fallback:        opts.Expired,
		fallbackTTL:     secondsOnly(int64(opts.ExpiredTimeout / time.Second)),
		wake:            make(chan struct{}, 1),
		buckets:         map[string]*cachedBucket{},
		expiryTimer:     time.NewTimer(time.Hour),
	}
	c.expiryTimer.Stop()
	if c.interval <= 0 {
		c.interval = DefaultReportInterval
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.defaultStrategy == nil {
		c.defaultStrategy = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}}
	}
	// F noAssignmentBehaviorShouldAllow: only a blanket DENY_ALL denies a
	// new bucket's first request.
	c.noAssignmentAllows = !isDenyAll(c.defaultStrategy)
	c.epoch = c.now()
	c.cache.Store(&map[string]*cachedBucket{})
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wg.Add(1)
	go c.run()
	return c, nil
}

// Allow decides one request matched to bucket, as Envoy's filter does, and
// counts it as allowed or denied. A bucket id seen for the first time is
// decided by NoAssignment and reported at once.
func (c *Client) Allow(bucket map[string]string) bool {
	var buf [256]byte
	key := appendKey(buf[:0], bucket)
	if cb := (*c.cache.Load())[string(key)]; cb != nil {
		allowed := c.allows(cb)
		if allowed {
			cb.usage.allowed.Add(1)
		} else {
			cb.usage.denied.Add(1)
		}
		return allowed
	}
	// F recordBucketUsage: a bucket not yet in the workers' copy is created
	// on the main thread; requests racing it are counted there too.
	allowed := c.noAssignmentAllows
	id, k := maps.Clone(bucket), string(key)
	c.post(func() { c.createBucket(id, k, allowed) })
	return allowed
}

// allows is F shouldAllowRequest.
func (c *Client) allows(cb *cachedBucket) bool {
	s := cb.action
	if s == nil {
		s = c.defaultStrategy
	}
	switch st := s.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		// Out-of-range enum values fall out of F's switch: allowed.
		return st.BlanketRule != typev3.RateLimitStrategy_DENY_ALL
	case *typev3.RateLimitStrategy_TokenBucket:
		return cb.limiter.consume(c.seconds())
	}
	return true
}

func isDenyAll(s *typev3.RateLimitStrategy) bool {
	r, ok := s.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_)
	return ok && r.BlanketRule == typev3.RateLimitStrategy_DENY_ALL
}

// seconds is the time on the buckets' clock, in seconds since New.
func (c *Client) seconds() float64 {
	return c.now().Sub(c.epoch).Seconds()
}

// Close stops the report timer and the stream and waits for the client's
// goroutines. Allow still decides afterwards, but nothing is reported.
func (c *Client) Close() {
	c.cancel()
	c.wg.Wait()
}

// post queues f for the main goroutine without blocking (Envoy's
// dispatcher post).
func (c *Client) post(f func()) {
	c.queueMu.Lock()
	c.queue = append(c.queue, f)
	c.queueMu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *Client) takeQueue() []func() {
	c.queueMu.Lock()
	defer c.queueMu.Unlock()
	q := c.queue
	c.queue = nil
	return q
}

// run is Envoy's main thread: bucket creation, the report timer, responses,
// stream closes and the assignments' timers, one at a time.
func (c *Client) run() {
	defer c.wg.Done()
	defer c.expiryTimer.Stop()
	var reportTick <-chan time.Time
	for {
		select {
		case <-c.ctx.Done():
			if c.reportTimer != nil {
				c.reportTimer.Stop()
			}
			c.closeStream()
			return
		case <-c.wake:
			for _, f := range c.takeQueue() {
				f()
			}
		case <-reportTick:
			c.onSendReportsTimer()
			c.reportTimer.Reset(c.interval)
		case <-c.expiryTimer.C:
			c.runExpiries()
		}
		if c.reportTimer != nil {
			reportTick = c.reportTimer.C
		}
		c.armExpiryTimer()
	}
}

// publish is GC writeBucketsToTLS: the workers see a new copy.
func (c *Client) publish() {
	m := maps.Clone(c.buckets)
	c.cache.Store(&m)
}

// createBucket is GC createBucketImpl.
func (c *Client) createBucket(id map[string]string, key string, allowed bool) {
	if !c.streamTried {
		c.streamTried = true
		c.reportTimer = time.NewTimer(c.interval)
		c.startStream()
	}
	if cb, ok := c.buckets[key]; ok {
		if allowed {
			cb.usage.allowed.Add(1)
		} else {
			cb.usage.denied.Add(1)
		}
		return
	}
	u := &usage{lastReport: c.now()}
	if allowed {
		u.allowed.Store(1)
	} else {
		u.denied.Store(1)
	}
	cb := &cachedBucket{id: id, usage: u, from: FromDefault}
	c.buckets[key] = cb
	c.send(c.report(cb))
	c.publish()
}

// report is GC buildReports: the given buckets' usage, or every bucket's,
// counts reset as they are read, with the domain.
func (c *Client) report(only ...*cachedBucket) *rlqspb.RateLimitQuotaUsageReports {
	r := &rlqspb.RateLimitQuotaUsageReports{Domain: c.domain}
	add := func(cb *cachedBucket) {
		now := c.now()
		elapsed := now.Sub(cb.usage.lastReport)
		cb.usage.lastReport = now
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqspb.BucketId{Bucket: cb.id},
			TimeElapsed:        durationSeconds(int64(elapsed / time.Second)),
			NumRequestsAllowed: cb.usage.allowed.Swap(0),
			NumRequestsDenied:  cb.usage.denied.Swap(0),
		})
	}
	if len(only) > 0 {
		for _, cb := range only {
			add(cb)
		}
		return r
	}
	for _, cb := range c.buckets {
		add(cb)
	}
	return r
}

// onSendReportsTimer is GC's: the report is built (counts reset) before the
// stream is reopened, and dropped if it cannot be.
func (c *Client) onSendReportsTimer() {
	r := c.report()
	if c.stream == nil && !c.startStream() {
		c.stats.reportsDropped.Add(1)
		return
	}
	c.send(r)
}

// send is GC sendUsageReportImpl: nothing when the stream is closed.
func (c *Client) send(r *rlqspb.RateLimitQuotaUsageReports) {
	if c.stream == nil || c.stream.Send(r) != nil {
		c.stats.reportsDropped.Add(1)
		return
	}
	c.stats.reportsSent.Add(1)
}

// startStream is GC startStreamImpl; its receiver posts each response and,
// at the end, the close (GC onReceiveMessage, onRemoteClose).
func (c *Client) startStream() bool {
	if c.stream != nil {
		return true
	}
	ctx, cancel := context.WithCancel(c.ctx)
	stream, err := c.rlqs.StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		c.stats.streamStartFailures.Add(1)
		return false
	}
	c.stream, c.streamCancel = stream, cancel
	c.stats.streamsOpened.Add(1)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			resp, err := stream.Recv()
			if err != nil {
				c.post(func() { c.onRemoteClose(stream) })
				return
			}
			c.post(func() { c.onResponse(resp) })
		}
	}()
	return true
}

// onRemoteClose forgets the stream; nothing else happens until the next
// report tick.
func (c *Client) onRemoteClose(stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient) {
	if c.stream != stream {
		return
	}
	c.stats.streamsClosed.Add(1)
	c.closeStream()
}

func (c *Client) closeStream() {
	if c.streamCancel != nil {
		c.streamCancel()
	}
	c.stream, c.streamCancel = nil, nil
}
