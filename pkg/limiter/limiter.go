// Package limiter decides rate limits on Redis, on the same counters and with
// the same Lua scripts as the rate limit service, so that a Go program and
// Envoy's requests through the service can count against one limit.
//
// A Limiter takes the hits of one request (a key, a limit, a cost each) and
// decides them all or nothing: when any of them does not fit, none is
// charged. The hits of one Redis server (of one hash slot on a Cluster) are
// decided atomically by one script; across Cluster slots each slot's part is
// decided at once and, when the request turns out denied, the parts charged
// are given back right after, so that for that round trip other requests can
// see them. Each hit gets a Verdict: admitted or not, what remains of its
// limit, and when it frees up. The clock is Redis TIME, read inside the
// script, so that every instance sharing one Redis agrees on it.
//
// A denial Redis gave is repeated from the process's memory for the same
// counter and cost for up to Options.DenyCache (a second by default), so that
// a client hammering a full counter costs no store call; it only ever
// repeats a denial, so the error is towards denying, and it is bounded.
//
// The store is a go-redis *redis.Client (standalone, or a Sentinel failover
// client) or *redis.ClusterClient, or the embedded store (NewEmbedded), an
// in-process Redis for tests and single instances.
//
// Keys name counters. Key builds the key the service gives a descriptor's
// limit, so that a Go program counts on the counter Envoy's requests count on.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/pkgbridge"
	"github.com/slidingwindow/ratelimit/internal/redisstore"
	pkgconfig "github.com/slidingwindow/ratelimit/pkg/config"
)

func init() {
	pkgbridge.LimiterOf = func(l any) *limiter.Limiter { return l.(*Limiter).lim }
}

// Algorithm is how a limit's window slides.
type Algorithm uint8

// The algorithms, as the config file names them (String).
const (
	// SlidingWindowLog keeps one entry per admitted unit: exact, memory
	// grows with the limit.
	SlidingWindowLog Algorithm = Algorithm(config.SlidingWindowLog)
	// SlidingWindowCounter weighs the previous window's count by its
	// overlap with the sliding window: two counters, close to exact.
	SlidingWindowCounter Algorithm = Algorithm(config.SlidingWindowCounter)
	// FixedWindow is one counter per window, as envoyproxy/ratelimit
	// counts: up to twice the limit across a window's edge.
	FixedWindow Algorithm = Algorithm(config.FixedWindow)
	// GCRA is a token bucket of Limit.Burst units refilled at the rate
	// Limit.Requests per Limit.Window.
	GCRA Algorithm = Algorithm(config.GCRA)
)

// String returns the algorithm's name in the config file, such as
// "sliding_window_log".
func (a Algorithm) String() string { return config.Algorithm(a).String() }

// ParseAlgorithm returns the algorithm the config file names s.
func ParseAlgorithm(s string) (Algorithm, error) {
	a, err := config.ParseAlgorithm(s)
	if err != nil {
		return 0, err
	}
	if a == config.ReferenceFixedWindow {
		return 0, fmt.Errorf("algorithm %q names its counters by the service's clock: use it through the service", s)
	}
	return Algorithm(a), nil
}

// Limit is how many units a window admits, and how it slides.
type Limit struct {
	// Algorithm decides how the window slides; zero means
	// SlidingWindowCounter (the service's default when --default-algorithm
	// does not say otherwise).
	Algorithm Algorithm
	// Requests is the number of units Window admits; 0 admits nothing.
	Requests uint32
	// Window is the window's length, a whole number of seconds.
	Window time.Duration
	// Burst is, for GCRA, the bucket's size in units; zero means Requests.
	// Other algorithms ignore it.
	Burst uint32
}

// LimitOf returns a config rule's limit as a Limit, to decide on the
// counter of the rule from Go (with Key). A limit whose windows follow the
// calendar (its Calendar is set) is refused: a Limit has windows of one
// length, and would count at another counter than the service's.
func LimitOf(l pkgconfig.Limit) (Limit, error) {
	if l.Calendar != "" {
		return Limit{}, fmt.Errorf("limit of calendar windows %s: a Limit has windows of one length", l.Calendar)
	}
	a, err := ParseAlgorithm(l.Algorithm)
	if err != nil {
		return Limit{}, err
	}
	return Limit{Algorithm: a, Requests: l.Requests, Window: l.Window, Burst: l.Burst}, nil
}

// FailureMode is the answer a hit gets when the store cannot decide it.
type FailureMode uint8

const (
	// FailOpen admits the hit without charging it (the zero value, as
	// Envoy's failure_mode_deny: false).
	FailOpen FailureMode = iota
	// FailClosed denies the hit.
	FailClosed
)

// Hit asks whether Cost more units fit Limit on the counter Key.
type Hit struct {
	// Key names the counter: hits with one Key count together. Key builds
	// the service's keys; any string will do for a counter of one's own,
	// and a Redis Cluster hash tag ({...}) in it picks its slot.
	Key string
	// Limit is the limit the counter is held to.
	Limit Limit
	// Cost is the number of units the hit takes; zero checks without
	// taking, and is denied while nothing remains.
	Cost uint64
	// Shadow evaluates and charges the hit as usual, but its denial denies
	// neither it nor the request (a dry run of a new limit).
	Shadow bool
	// FailureMode answers the hit when the store cannot.
	FailureMode FailureMode
}

// Verdict is the answer for one Hit.
type Verdict struct {
	// Admitted reports that the hit fits its limit. A shadow hit's
	// Admitted says whether it would have.
	Admitted bool
	// Remaining is the number of units still available after the decision.
	Remaining uint64
	// ResetAfter is, for an admitted hit, the time until the window is
	// empty again; for a denied one, until its cost would fit if nothing
	// else came (the retry-after the service announces), or the window when
	// it never will (CostExceedsLimit).
	ResetAfter time.Duration
	// CostExceedsLimit reports a hit whose cost is more than its limit (or
	// GCRA bucket) can ever hold: it is denied without asking the store, and
	// waiting will not help.
	CostExceedsLimit bool
	// FromFailureMode reports an answer given by the hit's FailureMode
	// because the store could not answer.
	FromFailureMode bool
}

// Errors Decide returns, with errors.Is.
var (
	// ErrStore wraps every failure to get an answer from the store
	// (unreachable, timed out, an unexpected reply).
	ErrStore = limiter.ErrStore
	// ErrOverloaded reports a request whose deadline passed before it was
	// sent to the store: the process, not the store, was too slow.
	ErrOverloaded = limiter.ErrOverloaded
	// ErrClosed answers the calls made after Close; it wraps ErrStore.
	ErrClosed = limiter.ErrClosed
	// ErrInvalid reports a hit, a key or a client the limiter cannot work
	// with (an unknown algorithm or failure mode, a window that is not
	// whole seconds, a limit past its algorithm's bound): nothing was sent.
	ErrInvalid = errors.New("invalid")
)

// Options configure a Limiter. A nil *Options means the defaults.
type Options struct {
	// Timeout bounds a request's store work when its context has a later
	// deadline or none; zero (or less) means one second.
	Timeout time.Duration
	// DenyCache is how long at most a denial Redis gave is repeated from
	// memory for the same counter and cost: zero means a second, a
	// negative value turns the cache off (as the service's --deny-cache 0).
	DenyCache time.Duration
}

// Limiter decides hits on a Redis store. It is safe for concurrent use.
type Limiter struct {
	lim       *limiter.Limiter
	store     *redisstore.Store // the embedded store, closed with the limiter
	closeOnce sync.Once
}

// New returns a Limiter on client: a *redis.Client (standalone, or a
// Sentinel failover client) or a *redis.ClusterClient. Concurrent requests
// share pipelines to each server. On a cluster, a request's hits are grouped
// by hash slot and every group is decided at once, each on its slot's
// master. The caller keeps owning client: Close does not close it.
//
// The client must not retry (MaxRetries: -1), as the service's own client
// does not: a decision is not idempotent, and a command re-sent after its
// reply was lost would charge it twice. ContextTimeoutEnabled: true lets a
// caller's deadline end a stalled call. Another kind of client (a Ring
// shards a request's keys across servers) or a retrying one is refused with
// an error wrapping ErrInvalid.
func New(client redis.UniversalClient, opts *Options) (*Limiter, error) {
	var retries int
	switch c := client.(type) {
	case *redis.Client:
		retries = c.Options().MaxRetries
	case *redis.ClusterClient:
		retries = c.Options().MaxRetries
	default:
		return nil, fmt.Errorf("%w client: %T, want a *redis.Client or a *redis.ClusterClient", ErrInvalid, client)
	}
	// go-redis reads a client's -1 as 0 retries, and 0 as its default of 3.
	if retries > 0 {
		return nil, fmt.Errorf("%w client: %d retries, want none (MaxRetries: -1): a decision re-sent after its reply was lost is charged twice", ErrInvalid, retries)
	}
	return &Limiter{lim: limiter.New(client, internalOptions(opts))}, nil
}

// NewEmbedded returns a Limiter on the embedded store: an in-process Redis
// (miniredis) on a loopback port, one replica, shared with no other process
// and not persistent. Close stops it.
func NewEmbedded(opts *Options) (*Limiter, error) {
	store, err := redisstore.Open(redisstore.Config{})
	if err != nil {
		return nil, err
	}
	return &Limiter{lim: limiter.New(store.Client, internalOptions(opts)), store: store}, nil
}

func internalOptions(opts *Options) *limiter.Options {
	o := &limiter.Options{}
	if opts != nil {
		o.Timeout = max(opts.Timeout, 0)
		o.DenyCache = opts.DenyCache
	}
	return o
}

// Decide decides the hits of one request, all or nothing, and returns a
// verdict per hit, in order. When any hit that is not Shadow does not fit,
// none is charged (on a Cluster, the slots' parts charged are given back
// right after). Hits on the same Key are one demand: their costs add up
// against the smallest of their limits.
//
// When the store cannot answer, Decide returns an error wrapping ErrStore (or
// ErrOverloaded), together with verdicts: the hits the store could not decide
// (on a Cluster, those of the failed slots) are answered by their failure
// modes, marked FromFailureMode. A hit that cannot be decided at all returns
// an error wrapping ErrInvalid and no verdicts.
func (l *Limiter) Decide(ctx context.Context, hits ...Hit) ([]Verdict, error) {
	in := make([]limiter.Hit, len(hits))
	for i, h := range hits {
		lh, err := h.internal()
		if err != nil {
			return nil, err
		}
		in[i] = lh
	}
	out, err := l.lim.Decide(ctx, in)
	if out == nil {
		return nil, err
	}
	verdicts := make([]Verdict, len(out))
	for i, v := range out {
		verdicts[i] = Verdict{
			Admitted:         v.Admitted,
			Remaining:        v.Remaining,
			ResetAfter:       v.ResetAfter,
			CostExceedsLimit: v.CostExceedsLimit,
			FromFailureMode:  v.FailureVerdict,
		}
	}
	return verdicts, err
}

// Reset empties the counter of key, kept by algorithm alg, so that its whole
// limit is available again. A denial this process remembers for it is
// forgotten; other processes' deny caches (Options.DenyCache) may repeat
// theirs until they expire.
func (l *Limiter) Reset(ctx context.Context, key string, alg Algorithm) error {
	h, err := Hit{Key: key, Limit: Limit{Algorithm: alg, Window: time.Second}}.internal()
	if err != nil {
		return err
	}
	_, err = l.lim.Reset(ctx, h)
	return err
}

// Close waits for the calls in flight, then stops the limiter (and the
// embedded store). Later calls are answered by failure mode, with ErrClosed.
// Closing again does nothing.
func (l *Limiter) Close() {
	l.closeOnce.Do(func() {
		l.lim.Close()
		if l.store != nil {
			_ = l.store.Close() // an in-process server: nothing to report
		}
	})
}

// internal checks h as the config checks a rule, and turns it into the
// internal limiter's hit.
func (h Hit) internal() (limiter.Hit, error) {
	alg, err := h.Limit.algorithm()
	if err != nil {
		return limiter.Hit{}, err
	}
	switch {
	case h.Key == "":
		return limiter.Hit{}, fmt.Errorf("%w hit: empty key", ErrInvalid)
	case h.FailureMode > FailClosed:
		return limiter.Hit{}, fmt.Errorf("%w hit: failure mode %d", ErrInvalid, h.FailureMode)
	}
	if err := alg.CheckLimit(h.Limit.Requests); err != nil {
		return limiter.Hit{}, fmt.Errorf("%w limit: %w", ErrInvalid, err)
	}
	hit := limiter.Hit{
		Key:         h.Key,
		Algorithm:   alg,
		Limit:       h.Limit.Requests,
		Window:      h.Limit.Window,
		Cost:        h.Cost,
		Shadow:      h.Shadow,
		FailureMode: config.FailureAllow,
	}
	if alg.Bucket() {
		if hit.Burst = h.Limit.Burst; hit.Burst == 0 {
			hit.Burst = h.Limit.Requests
		}
		// As the config bounds a bucket: the time it takes to refill.
		if h.Limit.Requests > 0 && float64(hit.Burst)*float64(hit.Window)/float64(hit.Limit) > float64(config.MaxWindow) {
			return limiter.Hit{}, fmt.Errorf("%w limit: a burst of %d takes longer than %v to refill", ErrInvalid, hit.Burst, config.MaxWindow)
		}
	}
	if h.FailureMode == FailClosed {
		hit.FailureMode = config.FailureDeny
	}
	return hit, nil
}

// algorithm checks the limit's algorithm and window.
func (l Limit) algorithm() (config.Algorithm, error) {
	alg := l.Algorithm
	if alg == 0 {
		alg = SlidingWindowCounter
	}
	switch {
	case alg > GCRA:
		return 0, fmt.Errorf("%w limit: algorithm %d", ErrInvalid, alg)
	case l.Window < time.Second || l.Window%time.Second != 0 || l.Window > config.MaxWindow:
		return 0, fmt.Errorf("%w limit: window %v is not a whole number of seconds up to %v", ErrInvalid, l.Window, config.MaxWindow)
	}
	return config.Algorithm(alg), nil
}

// Key returns the key the service gives the counter of a descriptor (domain
// and entries, in the request's order) held to limit, so that a hit on it
// counts together with the service's. prefix is the service's key prefix
// (--key-prefix), usually empty. limit must be the rule's, algorithm included
// (LimitOf gives it): the key names both. Entries matched by a
// share_threshold wildcard are not covered: their counter is named by the
// pattern.
func Key(prefix, domain string, limit Limit, entries ...pkgconfig.Entry) (string, error) {
	alg, err := limit.algorithm()
	if err != nil {
		return "", err
	}
	b := limiter.KeyBuilder{Prefix: prefix}
	b.Reset(domain)
	for _, e := range entries {
		b.Add(e.Key, e.Value)
	}
	return b.Key(alg, limit.Window), nil
}
