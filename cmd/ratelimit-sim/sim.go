package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

// algorithms are the limiter's algorithms, in the order they are reported.
// GCRA runs with a bucket of -burst units (default: the limit): a token
// bucket is not a sliding window, and the table shows how the two differ.
// reference_fixed_window is left out: it counts as fixed_window does, in
// windows its keys name from the service's clock, which the replay does not
// move.
var algorithms = slices.DeleteFunc(config.Algorithms(), config.Algorithm.ReferenceKeys)

// referenceName names the exact reference in results.
const referenceName = "exact reference"

// Result is what one algorithm did on one trace.
type Result struct {
	Trace     string
	Algorithm string // an algorithm's name, or referenceName
	Limit     uint32
	Requests  int
	Admitted  int

	// WrongAdmits and WrongDenies are the primary metric: decisions that
	// differ from the exact sliding window's given the algorithm's own
	// admitted history. A request at t with cost c is wrongly admitted when
	// the algorithm admitted it but its admitted cost in (t - window, t]
	// plus c exceeds the limit; wrongly denied when it denied it but it
	// would have fit.
	WrongAdmits, WrongDenies int

	// ExtraAdmits and MissingAdmits compare with the exact reference run on
	// its own on the same trace, request by request: admitted by the
	// algorithm but not by the reference, and the converse. After a first
	// disagreement the two histories differ, so later disagreements may be
	// consequences rather than mistakes: this is the secondary metric.
	ExtraAdmits, MissingAdmits int

	// MaxWindow is the largest admitted cost of one client in any window of
	// the window's length, over all clients.
	MaxWindow uint64

	// Bands splits requests and wrong decisions (primary metric) by the
	// nominal rate of their client, for traces with Rates.
	Bands [len(bands)]Band
}

// Band counts the requests of clients whose rate is in one band.
type Band struct {
	Clients, Requests, Wrong int
}

// bands are the lower bounds of the client rate bands, as multiples of the
// limit, in decreasing order; the last band takes every rate below.
var bands = [...]float64{1, 0.5, 0}

func bandOf(rate float64) int {
	for i, lo := range bands {
		if rate >= lo {
			return i
		}
	}
	return len(bands) - 1
}

// WorstOverAdmission is MaxWindow over the limit: 1 means the limit was
// reached in some window and never passed; 2 means twice the limit passed.
func (r Result) WorstOverAdmission() float64 { return float64(r.MaxWindow) / float64(r.Limit) }

// window is one client's admitted requests inside the sliding window ending
// at the last request seen: a queue of (time, cost) and their total.
type window struct {
	at    []int64
	cost  []uint64
	head  int
	total uint64
}

// slide drops what left the window (t - w, t].
func (q *window) slide(t, w int64) {
	for q.head < len(q.at) && q.at[q.head] <= t-w {
		q.total -= q.cost[q.head]
		q.head++
	}
	if q.head > 1024 && q.head*2 > len(q.at) { // reclaim the consumed front
		q.at = append(q.at[:0], q.at[q.head:]...)
		q.cost = append(q.cost[:0], q.cost[q.head:]...)
		q.head = 0
	}
}

func (q *window) push(t int64, c uint64) {
	q.at = append(q.at, t)
	q.cost = append(q.cost, c)
	q.total += c
}

// exact decides like a perfect sliding window: admitted iff the admitted
// cost in (t - window, t] plus cost fits the limit. Denials are not counted.
type exact struct {
	limit   uint64
	windowU int64
	clients []window
}

func newExact(clients int, limit uint32, w time.Duration) *exact {
	return &exact{limit: uint64(limit), windowU: w.Microseconds(), clients: make([]window, clients)}
}

// fits reports whether r fits the window of its client, without recording.
func (e *exact) fits(r Request) bool {
	q := &e.clients[r.Client]
	q.slide(r.At, e.windowU)
	return q.total+uint64(r.Cost) <= e.limit
}

// record adds an admitted r and returns its client's admitted cost in the
// window ending at r.
func (e *exact) record(r Request) uint64 {
	q := &e.clients[r.Client]
	q.slide(r.At, e.windowU)
	q.push(r.At, uint64(r.Cost))
	return q.total
}

// runReference runs the exact reference on its own and returns its result
// and its decisions.
func runReference(tr *Trace, p Params) (Result, []bool) {
	res := Result{Trace: tr.Name, Algorithm: referenceName, Limit: p.Limit, Requests: len(tr.Requests)}
	ref := newExact(tr.Clients, p.Limit, p.Window)
	decisions := make([]bool, len(tr.Requests))
	for i, r := range tr.Requests {
		if ref.fits(r) {
			decisions[i] = true
			res.Admitted++
			res.MaxWindow = max(res.MaxWindow, ref.record(r))
		}
	}
	return res, decisions
}

// score is the bookkeeping of one algorithm's run, fed one decision at a
// time: its own history, checked by an exact window.
type score struct {
	res     Result
	history *exact
	ref     []bool
	rates   []float64
}

func newScore(tr *Trace, p Params, name string, ref []bool) *score {
	s := &score{
		res:     Result{Trace: tr.Name, Algorithm: name, Limit: p.Limit, Requests: len(tr.Requests)},
		history: newExact(tr.Clients, p.Limit, p.Window),
		ref:     ref,
		rates:   tr.Rates,
	}
	for _, rate := range tr.Rates {
		s.res.Bands[bandOf(rate)].Clients++
	}
	return s
}

func (s *score) add(i int, r Request, admitted bool) {
	fits := s.history.fits(r)
	wrong := admitted != fits
	switch {
	case admitted && !fits:
		s.res.WrongAdmits++
	case !admitted && fits:
		s.res.WrongDenies++
	}
	if s.rates != nil {
		b := &s.res.Bands[bandOf(s.rates[r.Client])]
		b.Requests++
		if wrong {
			b.Wrong++
		}
	}
	switch {
	case admitted && !s.ref[i]:
		s.res.ExtraAdmits++
	case !admitted && s.ref[i]:
		s.res.MissingAdmits++
	}
	if admitted {
		s.res.Admitted++
		s.res.MaxWindow = max(s.res.MaxWindow, s.history.record(r))
	}
}

// maxShards bounds the stores one run spreads its clients over. With
// ClockTTL, miniredis walks (and sorts) every key of a store each time its
// clock has moved, so one store per few dozen clients keeps that walk short.
const maxShards = 32

// shard is one store of a run: an in-process miniredis and a limiter on it.
type shard struct {
	m      *miniredis.Miniredis
	lua    *luastore.Store
	client *redis.Client
	l      *limiter.Limiter
}

func openShard() (*shard, error) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		return nil, fmt.Errorf("miniredis: %w", err)
	}
	lua, err := luastore.Install(m)
	if err != nil {
		m.Close()
		return nil, err
	}
	m.SetTime(start)
	// TTLs run on the clock that SetTime moves, so keys expire in trace
	// time: a TTL too short or too long would show as wrong decisions.
	m.ClockTTL(true)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 1})
	// A generous timeout: under the race detector a script takes
	// milliseconds, and a timeout here would be a wrong answer.
	l := limiter.New(client, &limiter.Options{Timeout: 30 * time.Second, DenyCache: -1}) // trace time, not wall time
	return &shard{m: m, lua: lua, client: client, l: l}, nil
}

func (s *shard) close() {
	_ = s.client.Close() // an in-process store going away with its client: nothing to report
	s.lua.Close()
	s.m.Close()
}

// runAlgorithm replays tr through the real Lua script of algorithm a, on
// in-process miniredis stores of its own (each client's keys in one of them)
// whose clock is the trace's: before each request the clock is set to the
// request's time, so Redis TIME in the script is the trace time.
func runAlgorithm(ctx context.Context, tr *Trace, p Params, a config.Algorithm, ref []bool) (Result, error) {
	shards := make([]*shard, min(tr.Clients, maxShards))
	for i := range shards {
		s, err := openShard()
		if err != nil {
			return Result{}, err
		}
		defer s.close()
		shards[i] = s
	}

	keys := make([]string, tr.Clients)
	var kb limiter.KeyBuilder
	for c := range keys {
		kb.Reset("sim")
		kb.Add("client", strconv.Itoa(c))
		keys[c] = kb.Key(a, p.Window)
	}

	s := newScore(tr, p, a.String(), ref)
	hit := []limiter.Hit{{Algorithm: a, Limit: p.Limit, Window: p.Window, Burst: p.Burst}}
	for i, r := range tr.Requests {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		sh := shards[r.Client%len(shards)]
		sh.m.SetTime(time.UnixMicro(r.At))
		hit[0].Key, hit[0].Cost = keys[r.Client], uint64(r.Cost)
		v, err := sh.l.Decide(ctx, hit)
		if err != nil {
			return Result{}, fmt.Errorf("%s on %s, request %d: %w", a, tr.Name, i, err)
		}
		s.add(i, r, v[0].Admitted)
	}
	return s.res, nil
}
