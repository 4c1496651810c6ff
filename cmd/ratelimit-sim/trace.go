package main

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"time"
)

// Request is one request of a trace: a client (each client is its own
// counter key) asking for cost units at a time.
type Request struct {
	At     int64 // microseconds since the Unix epoch: Redis TIME's resolution
	Client int
	Cost   uint32
}

// Trace is a replayable sequence of requests, in strictly increasing time.
type Trace struct {
	Name     string
	About    string
	Clients  int
	Requests []Request
	// Rates is each client's nominal rate as a multiple of the limit, for
	// traces of several clients (nil otherwise).
	Rates []float64
}

// Params are the knobs every trace and every run share.
type Params struct {
	Limit    uint32        // units per window
	Window   time.Duration // whole seconds
	Duration time.Duration // length of each trace
	Seed     uint64
	Clients  int    // clients of the many-clients trace
	Burst    uint32 // gcra's bucket; 0: Limit
}

// start is the first instant of every trace: aligned to every window of
// whole seconds up to a day, so fixed windows start at start + k * window.
var start = time.Unix(1_700_006_400, 0) // 19676 days: a multiple of 86400

// traceNames lists the traces in the order they are reported.
var traceNames = []string{
	"poisson-0.8x",
	"poisson-1.5x",
	"poisson-3x",
	"weighted-1.5x",
	"edge",
	"edge-flood",
	"many-clients",
}

// makeTrace builds the named trace. The same params give the same trace.
func makeTrace(name string, p Params) (*Trace, error) {
	g := &gen{p: p, rng: rand.New(rand.NewPCG(p.Seed, nameHash(name)))}
	switch name {
	case "poisson-0.8x":
		return g.poisson(name, 0.8), nil
	case "poisson-1.5x":
		return g.poisson(name, 1.5), nil
	case "poisson-3x":
		return g.poisson(name, 3), nil
	case "weighted-1.5x":
		return g.weighted(name, 1.5), nil
	case "edge":
		return g.edge(name), nil
	case "edge-flood":
		return g.edgeFlood(name), nil
	case "many-clients":
		return g.manyClients(name), nil
	}
	return nil, fmt.Errorf("unknown trace %q, want one of %v or all", name, traceNames)
}

func nameHash(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

type gen struct {
	p   Params
	rng *rand.Rand
}

func (g *gen) windowMicros() int64 { return g.p.Window.Microseconds() }

func (g *gen) endMicros() int64 { return start.UnixMicro() + g.p.Duration.Microseconds() }

// poissonTimes returns the arrival times of a Poisson process of rate
// factor * limit per window, from start to the end of the trace.
func (g *gen) poissonTimes(factor float64) []int64 {
	meanGap := float64(g.windowMicros()) / (factor * float64(g.p.Limit)) // microseconds
	var times []int64
	t := float64(start.UnixMicro())
	end := float64(g.endMicros())
	for {
		t += g.rng.ExpFloat64() * meanGap
		if t >= end {
			return times
		}
		times = append(times, int64(t))
	}
}

// poisson is one client sending a Poisson stream at factor times its limit.
func (g *gen) poisson(name string, factor float64) *Trace {
	tr := &Trace{
		Name:    name,
		About:   fmt.Sprintf("one client, Poisson arrivals at %gx the limit", factor),
		Clients: 1,
	}
	for _, t := range g.poissonTimes(factor) {
		tr.Requests = append(tr.Requests, Request{At: t, Client: 0, Cost: 1})
	}
	tr.Requests = strictlyIncreasing(tr.Requests)
	return tr
}

// weighted is one client sending a Poisson stream of requests that cost 1
// to 5 units (uniformly, at most the limit), factor times the limit in units.
func (g *gen) weighted(name string, factor float64) *Trace {
	maxCost := min(5, g.p.Limit)
	mean := float64(1+maxCost) / 2
	tr := &Trace{
		Name:    name,
		About:   fmt.Sprintf("one client, Poisson arrivals costing 1 to %d units, %gx the limit in units", maxCost, factor),
		Clients: 1,
	}
	for _, t := range g.poissonTimes(factor / mean) {
		tr.Requests = append(tr.Requests, Request{At: t, Client: 0, Cost: 1 + g.rng.Uint32N(maxCost)})
	}
	tr.Requests = strictlyIncreasing(tr.Requests)
	return tr
}

// edge is the seeds' case, repeated every three windows: the full limit in a
// burst just before a fixed-window edge (starting a tenth of a window before
// it) and again just after it (starting a tenth of a window after it); each
// burst spreads its requests over a hundredth of a window. Three windows
// apart, a cycle starts with every counter empty.
func (g *gen) edge(name string) *Trace {
	w := g.windowMicros()
	offset, span := w/10, w/100
	tr := &Trace{
		Name:    name,
		About:   "the limit a tenth of a window before an edge and again a tenth after, every 3 windows",
		Clients: 1,
	}
	for edge := start.UnixMicro() + w; edge+offset+span <= g.endMicros(); edge += 3 * w {
		tr.Requests = append(tr.Requests, g.burst(edge-offset, span, int(g.p.Limit), 0)...)
		tr.Requests = append(tr.Requests, g.burst(edge+offset, span, int(g.p.Limit), 0)...)
	}
	tr.Requests = strictlyIncreasing(tr.Requests)
	return tr
}

// edgeFlood is the sliding counter's worst case, every three windows: the
// full limit in a burst that ends just before an edge, then a steady stream
// at 4x the limit through the next window. The counter weighs the burst by
// the share of the previous window still covered, as if it had been spread
// evenly, but all of it is still inside the sliding window until almost a
// whole window after the edge.
func (g *gen) edgeFlood(name string) *Trace {
	w := g.windowMicros()
	span := w / 100
	n := 4 * int(g.p.Limit)
	tr := &Trace{
		Name:    name,
		About:   "the limit just before an edge, then 4x the limit evenly through the next window, every 3 windows",
		Clients: 1,
	}
	for edge := start.UnixMicro() + w; edge+w <= g.endMicros(); edge += 3 * w {
		tr.Requests = append(tr.Requests, g.burst(edge-span-w/1000, span, int(g.p.Limit), 0)...)
		for i := 0; i < n; i++ {
			tr.Requests = append(tr.Requests, Request{At: edge + int64(i)*w/int64(n), Client: 0, Cost: 1})
		}
	}
	tr.Requests = strictlyIncreasing(tr.Requests)
	return tr
}

// burst is n requests spread evenly over span from at.
func (g *gen) burst(at, span int64, n, client int) []Request {
	rs := make([]Request, n)
	for i := range rs {
		rs[i] = Request{At: at + int64(i)*span/int64(n), Client: client, Cost: 1}
	}
	return rs
}

// manyClients is Clients clients, each its own key, each a Poisson stream
// whose rate follows Zipf's law by rank: client i (from 0) sends at
// 2 / (i+1) times the limit. The first sends twice its limit, the second
// exactly its limit, the third 2/3 of it, and the long tail far below it.
func (g *gen) manyClients(name string) *Trace {
	tr := &Trace{
		Name:    name,
		About:   fmt.Sprintf("%d clients, each its own key, Poisson at 2/rank times the limit (Zipf, s=1)", g.p.Clients),
		Clients: g.p.Clients,
		Rates:   make([]float64, g.p.Clients),
	}
	for c := 0; c < g.p.Clients; c++ {
		tr.Rates[c] = 2 / float64(c+1)
		for _, t := range g.poissonTimes(tr.Rates[c]) {
			tr.Requests = append(tr.Requests, Request{At: t, Client: c, Cost: 1})
		}
	}
	slices.SortStableFunc(tr.Requests, func(a, b Request) int {
		if a.At != b.At {
			return int(a.At - b.At)
		}
		return a.Client - b.Client
	})
	tr.Requests = strictlyIncreasing(tr.Requests)
	return tr
}

// strictlyIncreasing moves each request that does not come after the one
// before it by a microsecond later, so that no two requests share a Redis
// TIME (the sliding log would store the second one a microsecond later,
// which the trace would not know).
func strictlyIncreasing(rs []Request) []Request {
	for i := 1; i < len(rs); i++ {
		if rs[i].At <= rs[i-1].At {
			rs[i].At = rs[i-1].At + 1
		}
	}
	return rs
}

// units returns the trace's total cost.
func (tr *Trace) units() uint64 {
	var n uint64
	for _, r := range tr.Requests {
		n += uint64(r.Cost)
	}
	return n
}
