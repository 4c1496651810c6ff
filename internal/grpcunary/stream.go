package grpcunary

import (
	"context"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A stream's lifecycle. The reader opens it on its headers (reader.go),
// gathers its message, and once the message is whole asks the
// connection's AdmitFunc for a place and dispatches it to a worker
// (Server.dispatch); its handler answers (call.go), and finish forgets it.
// A stream may also end early: reset by the client or by the server, its
// message too late (expire), or refused before its handler (answerEarly).

// stream is one call.
type stream struct {
	c      *conn
	id     uint32
	method *method
	path   string
	ctx    context.Context
	cancel context.CancelFunc
	buf    []byte // the request as received: 5-byte prefix and message

	// Read side (reader goroutine).
	window        recvWindow
	received      int64 // DATA bytes, padding aside
	contentLength int64 // as the headers say; negative: not said
	refusal       *httpError
	expiry        *time.Timer // resets a unary stream whose message is late
	bodyDeadline  time.Time   // when the message must be whole
	inbox         *inbox      // a streaming call's messages
	ended         bool        // END_STREAM received
	started       bool        // dispatched to a handler

	// Write side (wmu).
	sendWindow int64
	reset      bool // reset by the client, or answered: nothing more is written

	held          heldBytes    // message bytes received and not yet decoded (flow.go)
	streamBytes   atomic.Int64 // its share of conn.streamBytes, until it is over
	admitted      func()       // the AdmitFunc's done: call admitDone
	admitReleased atomic.Bool  // admitted was called
}

// admitDone gives st's place back to Admit, once: when its handler returns,
// before the answer is written, or else when the stream is finished.
func (st *stream) admitDone() {
	if st.admitted != nil && st.admitReleased.CompareAndSwap(false, true) {
		st.admitted()
	}
}

// release drops the request's bytes once decoded, so that a flood of
// large requests holds each message once (as decoded), not twice, and stops
// counting them in what the connection's streams hold. By the handler's
// goroutine.
func (st *stream) release() {
	st.buf = nil
	st.c.unhold(st.held.release())
}

// errHoldingTooMuch answers a call whose message would take its
// connection's streams, or all connections', past what they may hold.
var errHoldingTooMuch = status.Error(codes.ResourceExhausted, "overloaded: too many request bytes still arriving")

// take appends a DATA payload to the request. The buffer grows with the
// bytes that came, never to a size only announced: a client could announce
// the largest message on every stream at little cost. A message that comes
// in one frame gets one buffer of its size. Past limit it keeps nothing and
// returns the message's size (as announced, or as received so far).
func (st *stream) take(p []byte, limit int) (int, bool) {
	if st.buf == nil && len(p) >= 5 {
		n := int(uint32(p[1])<<24 | uint32(p[2])<<16 | uint32(p[3])<<8 | uint32(p[4]))
		if n > limit {
			return n, false
		}
		st.buf = make([]byte, 0, min(5+n, len(p)))
	}
	if len(st.buf)+len(p) > 5+limit {
		return len(st.buf) + len(p) - 5, false
	}
	st.buf = append(st.buf, p...)
	return 0, true
}

// end marks st's request whole and dispatches it to a handler once Admit
// gives it a place, or answers a request that is not gRPC.
func (c *conn) end(st *stream) http2.ErrCode {
	st.ended = true
	if st.expiry != nil && !st.expiry.Stop() {
		return http2.ErrCodeNo // its message came too late: expire reset it
	}
	if st.contentLength >= 0 && st.received != st.contentLength {
		c.resetStream(st.id, http2.ErrCodeProtocol)
		return http2.ErrCodeNo
	}
	if st.inbox != nil {
		st.inbox.end()
		return http2.ErrCodeNo
	}
	if st.refusal != nil {
		// Its body waits for flow control, which the reader must not.
		st.started = true
		c.srv.handlers.Add(1)
		go c.answerHTTP(st)
		return http2.ErrCodeNo
	}
	if c.admit != nil {
		done, err := c.admit(st.path)
		if err != nil {
			c.answerEarly(st, err)
			return http2.ErrCodeNo
		}
		st.admitted = done
	}
	st.started = true
	c.controls = 0 // a call: PINGs between calls are not a flood
	c.srv.dispatch(st)
	return http2.ErrCodeNo
}

// finish forgets st: its handler returned, it never had one, or its
// message came too late. It closes a draining connection whose last stream
// this was. The reader may still hold st for a frame being read: its
// buffer is left to the collector, not dropped here.
func (c *conn) finish(st *stream) {
	c.smu.Lock()
	if c.streams[st.id] != st {
		c.smu.Unlock()
		return // finished already
	}
	delete(c.streams, st.id)
	done := c.draining && len(c.streams) == 0
	c.smu.Unlock()
	c.uncharge(st)
	c.unhold(st.held.release())
	if st.expiry != nil {
		st.expiry.Stop()
	}
	if st.cancel != nil {
		st.cancel()
	}
	st.admitDone()
	if done {
		c.close()
	}
}

// expire resets a unary stream whose message did not come whole by its
// deadline, or whose DATA stopped coming (see bodyTimeout), and forgets it,
// giving back its bytes. It runs on the timer's goroutine; the reader sees
// the timer fired (Stop false) if the client sends on the stream again.
func (c *conn) expire(st *stream) {
	c.refuse(RefusedSlowMessage)
	c.writeReset(st, st.id, http2.ErrCodeCancel)
	c.finish(st)
}

// resetStream resets stream id: a handler running sees its context
// canceled, a stream not yet dispatched is forgotten.
func (c *conn) resetStream(id uint32, code http2.ErrCode) {
	c.smu.Lock()
	st := c.streams[id]
	c.smu.Unlock()
	c.writeReset(st, id, code)
	if st == nil {
		return
	}
	if st.cancel != nil {
		st.cancel()
	}
	if !st.started {
		c.finish(st)
	}
}
