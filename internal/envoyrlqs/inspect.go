package envoyrlqs

import (
	"sync/atomic"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// Kind is the strategy deciding a bucket's requests.
type Kind int

const (
	KindNone        Kind = iota // no bucket of that id: never matched, abandoned, or its creation still queued
	KindAllowAll                // blanket ALLOW_ALL (or an unknown blanket rule, which F lets through)
	KindDenyAll                 // blanket DENY_ALL
	KindTokenBucket             // a token bucket
	KindFailOpen                // a strategy Envoy does not enforce (requests_per_time_unit, none): all allowed
)

// Source is where the deciding strategy comes from.
type Source int

const (
	FromDefault  Source = iota // no_assignment_behavior (Options.NoAssignment), or ALLOW_ALL
	FromServer                 // an assignment from the RLQS server
	FromFallback               // expired_assignment_behavior (Options.Expired), after a TTL ran out
)

// Assignment is what Envoy holds for one bucket now.
type Assignment struct {
	Kind Kind
	From Source
	// MaxTokens, TokensPerFill and FillInterval are the token bucket as the
	// action in force says.
	MaxTokens, TokensPerFill uint64
	FillInterval             time.Duration
	// FillRate is the rate, in tokens a second, of the limiter in use, which
	// an earlier action may have made (protoTokenBucketsEq); Tokens is what
	// it holds now, on Options.Now.
	FillRate, Tokens float64
	// Expires is when the assignment's (or the fallback's) timer fires, in
	// real time; zero for the default.
	Expires time.Time
	// Created counts the token buckets made for this bucket so far; each
	// started full.
	Created int
}

// Assignment returns what Envoy holds for bucket now, as its workers see it.
func (c *Client) Assignment(bucket map[string]string) Assignment {
	cb := (*c.cache.Load())[bucketKey(bucket)]
	if cb == nil {
		return Assignment{}
	}
	a := Assignment{From: cb.from, Expires: cb.expires, Created: cb.created}
	s := cb.action
	if s == nil {
		s = c.defaultStrategy
	}
	switch st := s.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		a.Kind = KindAllowAll
		if st.BlanketRule == typev3.RateLimitStrategy_DENY_ALL {
			a.Kind = KindDenyAll
		}
	case *typev3.RateLimitStrategy_TokenBucket:
		tb := st.TokenBucket
		a.Kind = KindTokenBucket
		a.MaxTokens = uint64(tb.GetMaxTokens())
		a.TokensPerFill = uint64(tb.GetTokensPerFill().GetValue())
		a.FillInterval = tb.GetFillInterval().AsDuration()
		a.FillRate = cb.limiter.fillRate
		a.Tokens = cb.limiter.remaining(c.seconds())
	default:
		a.Kind = KindFailOpen
	}
	return a
}

// Stats counts what the client did since New.
type Stats struct {
	StreamsOpened       uint64 // streams started
	StreamStartFailures uint64 // starts that failed (the report of that tick dropped)
	StreamsClosed       uint64 // streams the server or the connection ended
	ReportsSent         uint64 // usage reports written to a stream
	ReportsDropped      uint64 // usage reports built with no stream to take them
	Responses           uint64 // responses received
	ActionsApplied      uint64 // bucket actions taken (abandons included)
	ActionsIgnored      uint64 // bucket actions Envoy ignores
	Expirations         uint64 // assignments whose TTL ran out
}

type counters struct {
	streamsOpened, streamStartFailures, streamsClosed atomic.Uint64
	reportsSent, reportsDropped                       atomic.Uint64
	responses, actionsApplied, actionsIgnored         atomic.Uint64
	expirations                                       atomic.Uint64
}

// Stats returns the client's counts so far.
func (c *Client) Stats() Stats {
	s := &c.stats
	return Stats{
		StreamsOpened:       s.streamsOpened.Load(),
		StreamStartFailures: s.streamStartFailures.Load(),
		StreamsClosed:       s.streamsClosed.Load(),
		ReportsSent:         s.reportsSent.Load(),
		ReportsDropped:      s.reportsDropped.Load(),
		Responses:           s.responses.Load(),
		ActionsApplied:      s.actionsApplied.Load(),
		ActionsIgnored:      s.actionsIgnored.Load(),
		Expirations:         s.expirations.Load(),
	}
}
