// Package statsd sends envoyproxy/ratelimit's stats, the reference names of
// internal/metrics, to a statsd server as the reference does: with its own
// stats library, github.com/lyft/gostats, under its names and tags (each
// tag a `.__key=value` suffix), counters as what they gained since the last
// flush, timers in milliseconds, every flush interval. It implements
// metrics.Stats.
//
// gostats's sink has no stop: the goroutine New starts (it connects and
// writes) lives as long as the process, so a process makes one Sender.
package statsd

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	gostats "github.com/lyft/gostats"
	"go.uber.org/zap"

	"github.com/slidingwindow/ratelimit/internal/metrics"
)

// finalFlushWait bounds the wait for the last flush at the end of Run:
// gostats's sink holds a flush until the server has taken it, which over
// TCP with no server listening is seconds (it retries every 3 s).
const finalFlushWait = time.Second

// Sender is a gostats store whose sink is the statsd server.
type Sender struct {
	store    gostats.Store
	tags     map[string]string
	interval time.Duration
	log      *zap.Logger
	scopes   sync.Map // first part of a name → its gostats.Scope, with the tags
}

var _ metrics.Stats = (*Sender)(nil)

// New makes the sink of the statsd server at addr (host:port) over
// protocol (tcp or udp), flushed every interval by Run, every name with
// tags. gostats connects in the background and drops what it cannot send:
// no server listening never fails or holds up the service.
func New(addr, protocol string, interval time.Duration, tags map[string]string, log *zap.Logger) (_ *Sender, err error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("statsd address %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 1 || port > 65535 {
		return nil, fmt.Errorf("statsd address %q: %q is not a port number", addr, portText)
	}
	// gostats reads its defaults from the environment (GOSTATS_*,
	// STATSD_*) as it makes a sink, and panics on a value it cannot parse.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("statsd: %v", r)
		}
	}()
	sink := gostats.NewNetSink(gostats.WithStatsdHost(host), gostats.WithStatsdPort(port),
		gostats.WithStatsdProtocol(protocol), gostats.WithLogger(log.Named("statsd").Sugar()))
	s := &Sender{store: gostats.NewStore(sink, false), tags: tags, interval: interval, log: log}
	// The reference's server scope sends Go's runtime stats as ratelimit.go.*.
	s.store.AddStatGenerator(gostats.NewRuntimeStats(s.scope("ratelimit").Scope("go")))
	return s, nil
}

// scope is the scope of root, with the tags, made once: gostats counts a
// reserved tag name each time a scope with it is made.
func (s *Sender) scope(root string) gostats.Scope {
	if sc, ok := s.scopes.Load(root); ok {
		return sc.(gostats.Scope)
	}
	sc, _ := s.scopes.LoadOrStore(root, s.store.ScopeWithTags(root, s.tags))
	return sc.(gostats.Scope)
}

// split cuts a name at its first dot: the scope the reference makes it in,
// and the rest. Names carry request values (detailed_metric, an unknown
// domain), which gostats sends as they are: a control character, ':' or
// '|' is made '_', so that no value ends a line or starts another.
func split(name string) (root, rest string) {
	name = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == ':' || r == '|' {
			return '_'
		}
		return r
	}, name)
	root, rest, _ = strings.Cut(name, ".")
	return root, rest
}

// Counter is the statsd counter name, with the tags.
func (s *Sender) Counter(name string) metrics.StatCounter {
	root, rest := split(name)
	return s.scope(root).NewCounter(rest)
}

// Timer is the statsd timer name, with the tags.
func (s *Sender) Timer(name string) metrics.StatTimer {
	root, rest := split(name)
	return s.scope(root).NewTimer(rest)
}

// Run flushes the stats every flush interval until ctx ends, then once
// more, waiting at most finalFlushWait for that last one (it goes on
// without Run).
func (s *Sender) Run(ctx context.Context) {
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		ticker := time.NewTicker(s.interval)
		defer ticker.Stop()
		s.store.StartContext(ctx, ticker) // flushes once more when ctx ends
	}()
	<-ctx.Done()
	select {
	case <-flushed:
	case <-time.After(finalFlushWait):
		s.log.Warn("statsd: the last stats were not taken in time; they may be lost", zap.Duration("waited", finalFlushWait))
	}
}
