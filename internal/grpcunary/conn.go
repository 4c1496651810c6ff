package grpcunary

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// goAwayPing marks the PING that follows the first GOAWAY of a drain.
const goAwayPing = 0x676f61776179 // "goaway"

var clientPreface = []byte(http2.ClientPreface)

// conn is one client connection. Its reader goroutine (serve, in this
// file) owns the read side and the streams' lifecycle up to dispatch; the
// write side (writer.go) is guarded by wmu; flow.go gives back the
// connection window from any goroutine.
type conn struct {
	srv    *Server
	nc     net.Conn
	fr     *http2.Framer
	ctx    context.Context // canceled when the connection ends
	cancel context.CancelFunc
	admit  AdmitFunc  // this connection's, nil when the server has none
	flow   recvWindow // the connection's, reader goroutine

	// Read side: the reader goroutine only.
	hdec        *hpack.Decoder
	hp          headerParser
	block       headerBlock
	maxStreamID atomic.Uint32 // the highest stream id the client opened (written by the reader only)
	streamBytes atomic.Int64  // what the streams not over hold (see canHold)
	// PINGs and SETTINGS to answer since the last call or second.
	controls     int
	controlsFrom time.Time

	// Streams by id, from their headers until they end; smu guards it.
	smu     sync.Mutex
	streams map[uint32]*stream
	// draining: the final GOAWAY went (at lastID): no stream past it starts,
	// and the connection closes when the last stream ends.
	draining bool
	lastID   uint32
	gone     bool // closed: the streams' contexts are canceled

	// Write side (writer.go). Frames are appended to out, which the
	// flusher goroutine writes to the connection.
	wmu sync.Mutex
	// wcond is signaled when a send window grows, out was written, or the
	// connection closed.
	wcond       *sync.Cond
	out, spare  []byte
	flushQueued bool
	flush       chan struct{} // wakes the flusher
	// netMu orders the writes to nc: the flusher takes it before it lets
	// go of wmu, so close's last write follows the frames taken before.
	netMu      sync.Mutex
	henc       *hpack.Encoder
	hbuf       bytes.Buffer
	data       []byte        // one DATA payload being built
	sendWindow int64         // the connection's send window
	peerWindow int64         // the client's initial stream window
	peerFrame  uint32        // the largest frame the client takes
	closed     bool          // writes fail from now on
	goAwaySent bool          // the first GOAWAY of a drain went
	timers     []*time.Timer // stopped by close
}

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

	held          heldBytes    // connection window bytes of its message
	streamBytes   atomic.Int64 // its share of conn.streamBytes, until it is over
	admitted      func()       // the AdmitFunc's done: call admitDone
	admitReleased atomic.Bool  // admitted was called
}

// admitDone gives st's place back to Admit, once, from whichever goroutine
// gets there first: its handler returning, or its connection closing.
func (st *stream) admitDone() {
	if st.admitted != nil && st.admitReleased.CompareAndSwap(false, true) {
		st.admitted()
	}
}

// release drops the request's bytes once decoded, so that a flood of
// large requests holds each message once (as decoded), not twice, and
// gives their connection window back. By the handler's goroutine.
func (st *stream) release() {
	st.buf = nil
	st.c.unhold(st.held.release())
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{
		srv:        s,
		nc:         nc,
		streams:    map[uint32]*stream{},
		flow:       recvWindow{left: initialWindow - 1, size: connWindow}, // RFC 9113's 65,535
		sendWindow: initialWindow - 1,
		peerWindow: initialWindow - 1,
		peerFrame:  16 << 10,
		flush:      make(chan struct{}, 1),
	}
	if s.opts.NewConnAdmit != nil {
		c.admit = s.opts.NewConnAdmit()
	}
	c.wcond = sync.NewCond(&c.wmu)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.fr = http2.NewFramer(outWriter{c}, bufio.NewReaderSize(nc, bufferSize))
	c.hdec = hpack.NewDecoder(4096, c.hp.field)
	c.hdec.SetMaxStringLength(MaxHeaderListSize)
	c.fr.SetMaxReadFrameSize(16 << 10) // HTTP/2's default, which the settings keep
	c.fr.SetReuseFrames()
	c.henc = hpack.NewEncoder(&c.hbuf)
	return c
}

// serve reads the connection until it ends, then closes it.
func (c *conn) serve() {
	defer c.dropStreams() // after close, once nothing more is read
	defer c.close()
	// The preface and the first SETTINGS must come within the handshake
	// bound: a connection that sends neither holds nothing for long.
	c.nc.SetReadDeadline(time.Now().Add(DefaultHandshakeTimeout))
	preface := make([]byte, len(clientPreface))
	if _, err := io.ReadFull(c.nc, preface); err != nil {
		return
	}
	if !bytes.Equal(preface, clientPreface) {
		// Not HTTP/2: a FIN, then what the client still sends is read
		// briefly, so that the close is not a reset that loses the FIN.
		if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		c.nc.SetReadDeadline(time.Now().Add(time.Second))
		io.Copy(io.Discard, io.LimitReader(c.nc, 64<<10))
		return
	}
	err := c.write(func() error {
		if err := c.fr.WriteSettings(
			http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.srv.opts.MaxConcurrentStreams},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: MaxHeaderListSize},
		); err != nil {
			return err
		}
		inc := int64(connWindow - (initialWindow - 1))
		c.flow.left += inc
		return c.fr.WriteWindowUpdate(0, uint32(inc))
	})
	if err != nil {
		return
	}
	go c.flusher()
	if age := c.srv.opts.MaxConnectionAge; age > 0 {
		jitter := time.Duration(rand.Int64N(int64(age)/5+1)) - age/10
		c.after(age+jitter, c.drain)
	}

	first := true
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				if se.StreamID%2 == 1 && se.StreamID > c.maxStreamID.Load() {
					c.maxStreamID.Store(se.StreamID) // opened, and reset at once
				}
				c.resetStream(se.StreamID, se.Code)
				continue
			}
			var ce http2.ConnectionError
			switch {
			case errors.As(err, &ce):
				c.goAwayNow(http2.ErrCode(ce))
			case errors.Is(err, http2.ErrFrameTooLarge):
				c.goAwayNow(http2.ErrCodeFrameSize)
			}
			return
		}
		if first {
			// The client's preface ends with a SETTINGS frame.
			if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
				c.goAwayNow(http2.ErrCodeProtocol)
				return
			}
			c.nc.SetReadDeadline(time.Time{})
			first = false
		}
		var code http2.ErrCode
		switch f := f.(type) {
		case *http2.HeadersFrame:
			c.hp.reset()
			c.block = headerBlock{streamID: f.StreamID, endStream: f.StreamEnded(), selfDep: f.HasPriority() && f.Priority.StreamDep == f.StreamID}
			code = c.decodeHeaders(f.HeaderBlockFragment(), f.HeadersEnded())
		case *http2.ContinuationFrame:
			code = c.decodeHeaders(f.HeaderBlockFragment(), f.HeadersEnded())
		case *http2.DataFrame:
			code = c.onData(f)
		case *http2.SettingsFrame:
			code = c.onSettings(f)
		case *http2.PingFrame:
			code = c.onPing(f)
		case *http2.WindowUpdateFrame:
			code = c.onWindowUpdate(f)
		case *http2.RSTStreamFrame:
			code = c.onReset(f)
		case *http2.PriorityFrame:
			if f.StreamDep == f.StreamID {
				c.resetStream(f.StreamID, http2.ErrCodeProtocol) // depends on itself
			}
		case *http2.GoAwayFrame:
			// The client opens no more streams; those in flight finish.
		case *http2.PushPromiseFrame:
			code = http2.ErrCodeProtocol // only a server may push
		}
		if code != http2.ErrCodeNo {
			c.goAwayNow(code)
			return
		}
	}
}

// decodeHeaders decodes a fragment of the header block being read (the
// framer checks that CONTINUATIONs follow their HEADERS), and takes the
// block once it has ended. A block that does not decode leaves the
// connection's header table unknown, and one past maxHeaderBlockBytes
// would keep the reader decoding: connection errors both.
func (c *conn) decodeHeaders(fragment []byte, ended bool) http2.ErrCode {
	if c.block.size += len(fragment); c.block.size > maxHeaderBlockBytes {
		return http2.ErrCodeEnhanceYourCalm
	}
	if _, err := c.hdec.Write(fragment); err != nil {
		return http2.ErrCodeCompression
	}
	if !ended {
		return http2.ErrCodeNo
	}
	if err := c.hdec.Close(); err != nil {
		return http2.ErrCodeCompression
	}
	return c.onHeaders()
}

// onHeaders starts a call, or ends one when they are its trailers.
func (c *conn) onHeaders() http2.ErrCode {
	id := c.block.streamID
	if id%2 == 0 {
		return http2.ErrCodeProtocol
	}
	if id <= c.maxStreamID.Load() {
		c.smu.Lock()
		st := c.streams[id]
		c.smu.Unlock()
		if st == nil || st.ended {
			return http2.ErrCodeStreamClosed
		}
		if !c.block.endStream {
			return http2.ErrCodeProtocol // trailers end the stream
		}
		return c.end(st)
	}
	c.maxStreamID.Store(id)
	c.smu.Lock()
	draining, lastID, open := c.draining, c.lastID, len(c.streams)
	c.smu.Unlock()
	switch {
	case draining && id > lastID:
		return http2.ErrCodeNo // past the GOAWAY: the client knows it was not served
	case c.hp.truncated:
		c.resetStream(id, http2.ErrCodeFrameSize) // as grpc-go
		return http2.ErrCodeNo
	case c.block.selfDep:
		c.resetStream(id, http2.ErrCodeProtocol)
		return http2.ErrCodeNo
	case open >= int(c.srv.opts.MaxConcurrentStreams), !c.canHold(streamCost + int64(c.hp.size)):
		c.resetStream(id, http2.ErrCodeRefusedStream)
		return http2.ErrCodeNo
	}
	req, err := c.hp.result()
	if errors.Is(err, errMalformed) {
		c.resetStream(id, http2.ErrCodeProtocol)
		return http2.ErrCodeNo
	}

	// peerWindow changes on the reader goroutine only (onSettings).
	st := &stream{c: c, id: id, window: recvWindow{left: initialWindow - 1, size: initialWindow}, sendWindow: c.peerWindow, contentLength: req.contentLength}
	c.charge(st, streamCost+int64(c.hp.size))
	var he *httpError
	if errors.As(err, &he) {
		// Not gRPC: answered once the request has come, as HTTP servers do.
		st.refusal = he
		c.smu.Lock()
		c.streams[id] = st
		c.smu.Unlock()
		if c.block.endStream {
			return c.end(st)
		}
		return http2.ErrCodeNo
	}
	if err == nil {
		st.path = req.path
		// Not derived from the connection's context, which would keep a
		// child per call: close cancels the calls of its streams.
		if req.timeout >= 0 {
			st.ctx, st.cancel = context.WithTimeout(context.Background(), req.timeout)
		} else {
			st.ctx, st.cancel = context.WithCancel(context.Background())
		}
		if len(req.md) > 0 {
			st.ctx = newIncomingContext(st.ctx, req.md)
		}
		err = c.srv.lookup(st)
	}
	st.ended = c.block.endStream
	if err == nil && st.method.stream != nil {
		st.inbox = &inbox{ready: make(chan struct{}, 1)}
		st.started = true
	}
	c.smu.Lock()
	c.streams[id] = st
	if err == nil && st.inbox == nil && !st.ended {
		// The server's bound, which the call's own deadline may shorten
		// but not extend. Armed once st is in the map, where its expiry
		// finds it however soon it fires.
		total := c.srv.bodyTotal
		if req.timeout >= 0 {
			total = min(total, req.timeout)
		}
		st.bodyDeadline = time.Now().Add(total)
		st.expiry = time.AfterFunc(min(total, c.srv.bodyIdle), func() { c.expire(st) })
	}
	gone := c.gone
	c.smu.Unlock()
	if gone && st.cancel != nil {
		// close has run: its handler, if it gets one, sees it.
		st.cancel()
	}
	switch {
	case err != nil:
		// Refused before its message is read (grpc-go's early abort).
		c.answerEarly(st, err)
		return http2.ErrCodeNo
	case st.inbox != nil:
		// A streaming handler starts now and reads messages as they come.
		c.srv.handlers.Add(1)
		go c.handleStream(st)
		if st.ended {
			st.inbox.end()
		}
		return http2.ErrCodeNo
	case st.ended:
		return c.end(st)
	}
	return http2.ErrCodeNo
}

// canHold reports whether the connection's streams may hold n more bytes
// (a new stream's headers and state, or message bytes): within the
// connection's bound and the server's. The last quarter of the server's
// bound is kept for connections holding less than smallHolding, as a
// client's with a few calls in flight does, so that clients holding
// streams and messages on a few connections cannot keep the others from
// opening theirs.
func (c *conn) canHold(n int64) bool {
	mine, all, bound := c.streamBytes.Load()+n, c.srv.totals.bytes.Load()+n, c.srv.opts.MaxStreamBytes
	switch {
	case mine > c.srv.connHold, all > bound:
		return false
	case all > bound-bound/4:
		return mine <= smallHolding
	}
	return true
}

// charge counts the n bytes st holds until it is over; uncharge gives
// them back, once.
func (c *conn) charge(st *stream, n int64) {
	st.streamBytes.Store(n)
	c.account(n)
}

func (c *conn) uncharge(st *stream) {
	c.account(-st.streamBytes.Swap(0))
}

// account adds n to what the connection's streams hold, and to the
// server's total.
func (c *conn) account(n int64) {
	if n != 0 {
		c.streamBytes.Add(n)
		c.srv.totals.bytes.Add(n)
	}
}

// dropStreams forgets what the streams left at close hold, once the
// reader has stopped: a stream whose message never came whole has no
// handler to give its bytes back.
func (c *conn) dropStreams() {
	c.smu.Lock()
	left := make([]*stream, 0, len(c.streams))
	for _, st := range c.streams {
		left = append(left, st)
	}
	c.smu.Unlock()
	for _, st := range left {
		c.uncharge(st)
		c.account(-st.held.release())
	}
}

// onData adds a DATA frame to its call's message.
func (c *conn) onData(f *http2.DataFrame) http2.ErrCode {
	n := int64(f.Length)
	if !c.flow.take(n) {
		return http2.ErrCodeFlowControl
	}
	if c.giveBack(n) != nil {
		return http2.ErrCodeInternal
	}
	data := f.Data()
	id := f.StreamID
	c.smu.Lock()
	st := c.streams[id]
	c.smu.Unlock()
	switch {
	case st == nil && id > c.maxStreamID.Load():
		return http2.ErrCodeProtocol // DATA on a stream never opened
	case st == nil, st.ended:
		c.resetStream(id, http2.ErrCodeStreamClosed)
		return http2.ErrCodeNo
	case st.expiry != nil && !f.StreamEnded():
		// Not idle: wait again, within the body's deadline.
		if !st.expiry.Stop() {
			return http2.ErrCodeNo // expire has reset it
		}
		st.expiry.Reset(min(time.Until(st.bodyDeadline), c.srv.bodyIdle))
	}
	if !st.window.take(n) {
		c.resetStream(id, http2.ErrCodeFlowControl)
		return http2.ErrCodeNo
	}
	st.received += int64(len(data))
	if st.contentLength >= 0 && st.received > st.contentLength {
		c.resetStream(id, http2.ErrCodeProtocol)
		return http2.ErrCodeNo
	}
	if st.refusal == nil && !c.hold(st, int64(len(data))) {
		c.answerEarly(st, errHoldingTooMuch)
		return http2.ErrCodeNo
	}
	switch {
	case st.inbox != nil:
		if err := st.inbox.add(data, c.srv.opts.MaxRecvMsgSize); err != nil {
			c.resetStream(id, http2.ErrCodeEnhanceYourCalm)
			return http2.ErrCodeNo
		}
	case st.refusal == nil:
		if size, ok := st.take(data, c.srv.opts.MaxRecvMsgSize); !ok {
			c.answerEarly(st, errTooLarge(size, c.srv.opts.MaxRecvMsgSize))
			return http2.ErrCodeNo
		}
	}
	if f.StreamEnded() {
		return c.end(st)
	}
	if inc := st.window.give(n); inc > 0 {
		if c.write(func() error { return c.fr.WriteWindowUpdate(id, inc) }) != nil {
			return http2.ErrCodeInternal
		}
	}
	return http2.ErrCodeNo
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
	c.writeReset(st, st.id, http2.ErrCodeCancel)
	c.finish(st)
}

// throttleControls counts a PING or SETTINGS frame to answer and, past
// maxControlFrames within a second with no request between, stops reading
// the connection until the second is over: each costs an answer and a
// write, and a client that floods them is slowed down to that rate by its
// own TCP window, without being closed (a closed one comes back at once
// with a new connection, which costs more).
func (c *conn) throttleControls() {
	now := time.Now()
	if now.Sub(c.controlsFrom) > time.Second {
		c.controls, c.controlsFrom = 0, now
	}
	if c.controls++; c.controls > maxControlFrames {
		time.Sleep(time.Until(c.controlsFrom.Add(time.Second)))
		c.controls, c.controlsFrom = 1, time.Now()
	}
}

func (c *conn) onSettings(f *http2.SettingsFrame) http2.ErrCode {
	if f.IsAck() {
		return http2.ErrCodeNo
	}
	c.throttleControls()
	var code http2.ErrCode
	err := c.write(func() error {
		err := f.ForeachSetting(func(s http2.Setting) error {
			if err := s.Valid(); err != nil {
				return err
			}
			switch s.ID {
			case http2.SettingInitialWindowSize:
				delta := int64(s.Val) - c.peerWindow
				c.peerWindow = int64(s.Val)
				c.smu.Lock()
				for _, st := range c.streams {
					st.sendWindow += delta
				}
				c.smu.Unlock()
				c.wcond.Broadcast()
			case http2.SettingMaxFrameSize:
				c.peerFrame = s.Val
			case http2.SettingHeaderTableSize:
				c.henc.SetMaxDynamicTableSizeLimit(s.Val)
			}
			return nil
		})
		if err != nil {
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				code = http2.ErrCode(ce)
			} else {
				code = http2.ErrCodeProtocol
			}
			return nil
		}
		return c.fr.WriteSettingsAck()
	})
	if err != nil && code == http2.ErrCodeNo {
		code = http2.ErrCodeInternal
	}
	return code
}

func (c *conn) onPing(f *http2.PingFrame) http2.ErrCode {
	if f.IsAck() {
		if f.Data == pingData(goAwayPing) {
			c.goAwayFinal()
		}
		return http2.ErrCodeNo
	}
	c.throttleControls()
	if c.write(func() error { return c.fr.WritePing(true, f.Data) }) != nil {
		return http2.ErrCodeInternal
	}
	return http2.ErrCodeNo
}

func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) http2.ErrCode {
	var st *stream
	if f.StreamID != 0 {
		c.smu.Lock()
		st = c.streams[f.StreamID]
		c.smu.Unlock()
		if st == nil {
			if f.StreamID > c.maxStreamID.Load() {
				return http2.ErrCodeProtocol // a stream never opened
			}
			return http2.ErrCodeNo // over already
		}
	}
	var code http2.ErrCode
	c.write(func() error {
		w := &c.sendWindow
		if st != nil {
			w = &st.sendWindow
		}
		*w += int64(f.Increment)
		if *w > math.MaxInt32 {
			code = http2.ErrCodeFlowControl
		}
		c.wcond.Broadcast()
		return nil
	})
	if code != http2.ErrCodeNo && st != nil {
		// The stream's error: reset like any other, which cancels its call
		// or forgets it if it had not started.
		c.resetStream(st.id, code)
		return http2.ErrCodeNo
	}
	return code
}

// onReset ends a stream the client reset: its handler's context is
// canceled and nothing more is written on it.
func (c *conn) onReset(f *http2.RSTStreamFrame) http2.ErrCode {
	c.smu.Lock()
	st := c.streams[f.StreamID]
	c.smu.Unlock()
	if st == nil {
		if f.StreamID > c.maxStreamID.Load() {
			return http2.ErrCodeProtocol // a stream never opened
		}
		return http2.ErrCodeNo
	}
	c.write(func() error {
		st.reset = true
		c.wcond.Broadcast()
		return nil
	})
	if st.cancel != nil {
		st.cancel()
	}
	if !st.started {
		c.finish(st)
	}
	return http2.ErrCodeNo
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
