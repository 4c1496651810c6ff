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
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Flow control of what clients send: a stream may send initialWindow bytes
// before it gets more, and a connection connWindow, which is given back as
// the reader takes the bytes (they are then in the calls' buffers, which
// the stream windows, the message size and the stream count bound).
const (
	initialWindow = 64 << 10
	connWindow    = 1 << 20
	bufferSize    = 32 << 10
	// goAwayPing marks the PING that follows the first GOAWAY of a drain.
	goAwayPing = 0x676f61776179 // "goaway"
)

var clientPreface = []byte(http2.ClientPreface)

// conn is one client connection. Its reader goroutine (serve) owns the
// read side; the write side (framer writes, the header encoder, send
// windows) is guarded by wmu.
type conn struct {
	srv    *Server
	nc     net.Conn
	fr     *http2.Framer
	ctx    context.Context // canceled when the connection ends
	cancel context.CancelFunc

	// Read side: the reader goroutine only.
	hdec         *hpack.Decoder
	hp           headerParser
	block        headerBlock
	maxStreamID  atomic.Uint32 // the highest stream id the client opened (written by the reader only)
	connUnacked  uint32        // bytes read and not yet given back by WINDOW_UPDATE
	connRecvLeft int64         // bytes the client may still send on the connection

	// Streams by id, from their headers until they end; smu guards it.
	smu     sync.Mutex
	streams map[uint32]*stream
	// draining: the final GOAWAY went (at lastID): no stream past it starts,
	// and the connection closes when the last stream ends.
	draining bool
	lastID   uint32
	gone     bool // closed: the streams' contexts are canceled

	// Write side. Frames are appended to out, which the flusher goroutine
	// writes to the connection.
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
	unacked       uint32 // bytes read and not yet given back to the stream
	recvLeft      int64
	received      int64 // DATA bytes, padding aside
	contentLength int64 // as the headers say; negative: not said
	refusal       *httpError
	admitted      func()      // Admit's done: call admitDone
	expiry        *time.Timer // resets a unary stream whose message is late
	bodyDeadline  time.Time   // when the message must be whole
	inbox         *inbox      // a streaming call's messages
	ended         bool        // END_STREAM received
	started       bool        // dispatched to a handler

	// Write side (wmu).
	sendWindow int64
	reset      bool // reset by the client, or answered: nothing more is written

	admitReleased atomic.Bool // admitted was called
}

// A unary call's message must be whole by its deadline (60 s after its
// headers without one), and its stream must not go bodyIdleTimeout without
// DATA: a stream left open without its message would keep its place in
// Admit. Envoy sends a request whole; a large one on a loaded server keeps
// coming, if slowly.
const (
	bodyTimeout     = 60 * time.Second
	bodyIdleTimeout = 10 * time.Second
)

// admitDone gives st's place back to Admit, once, from whichever goroutine
// gets there first: its handler returning, its message coming too late, or
// its connection closing.
func (st *stream) admitDone() {
	if st.admitted != nil && st.admitReleased.CompareAndSwap(false, true) {
		st.admitted()
	}
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{
		srv:          s,
		nc:           nc,
		streams:      map[uint32]*stream{},
		connRecvLeft: initialWindow - 1, // RFC 9113's 65,535
		sendWindow:   initialWindow - 1,
		peerWindow:   initialWindow - 1,
		peerFrame:    16 << 10,
		flush:        make(chan struct{}, 1),
	}
	c.wcond = sync.NewCond(&c.wmu)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.fr = http2.NewFramer(outWriter{c}, bufio.NewReaderSize(nc, bufferSize))
	c.hdec = hpack.NewDecoder(4096, c.hp.field)
	c.hdec.SetMaxStringLength(maxHeaderListSize)
	c.fr.SetMaxReadFrameSize(16 << 10) // HTTP/2's default, which the settings keep
	c.fr.SetReuseFrames()
	c.henc = hpack.NewEncoder(&c.hbuf)
	return c
}

// serve reads the connection until it ends, then closes it.
func (c *conn) serve() {
	defer c.close()
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
	c.nc.SetReadDeadline(time.Time{})
	err := c.write(func() error {
		if err := c.fr.WriteSettings(
			http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.srv.opts.MaxConcurrentStreams},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderListSize},
		); err != nil {
			return err
		}
		c.connRecvLeft += connWindow - (initialWindow - 1)
		return c.fr.WriteWindowUpdate(0, connWindow-(initialWindow-1))
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
// connection's header table unknown: a connection error.
func (c *conn) decodeHeaders(fragment []byte, ended bool) http2.ErrCode {
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
	if draining && id > lastID {
		return http2.ErrCodeNo // past the GOAWAY: the client knows it was not served
	}
	if c.hp.truncated {
		c.resetStream(id, http2.ErrCodeFrameSize) // as grpc-go
		return http2.ErrCodeNo
	}
	if c.block.selfDep {
		c.resetStream(id, http2.ErrCodeProtocol)
		return http2.ErrCodeNo
	}
	if open >= int(c.srv.opts.MaxConcurrentStreams) {
		c.resetStream(id, http2.ErrCodeRefusedStream)
		return http2.ErrCodeNo
	}
	req, err := c.hp.result()
	if errors.Is(err, errMalformed) {
		c.resetStream(id, http2.ErrCodeProtocol)
		return http2.ErrCodeNo
	}

	// peerWindow changes on the reader goroutine only (onSettings).
	st := &stream{c: c, id: id, recvLeft: initialWindow - 1, sendWindow: c.peerWindow, contentLength: req.contentLength}
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
	if err == nil && c.srv.opts.Admit != nil {
		st.admitted, err = c.srv.opts.Admit(req.path)
	}
	st.ended = c.block.endStream
	if err == nil && st.method.stream != nil {
		st.inbox = &inbox{ready: make(chan struct{}, 1)}
		st.started = true
	}
	if err == nil && st.inbox == nil && !st.ended {
		total := bodyTimeout
		if req.timeout >= 0 {
			total = req.timeout
		}
		st.bodyDeadline = time.Now().Add(total)
		st.expiry = time.AfterFunc(min(total, c.srv.bodyIdle), func() { c.expire(st) })
	}
	c.smu.Lock()
	c.streams[id] = st
	gone := c.gone
	c.smu.Unlock()
	if gone {
		// close has run: nobody else gives its place back.
		st.admitDone()
		if st.expiry != nil {
			st.expiry.Stop()
		}
		if st.cancel != nil {
			st.cancel() // its handler, if it gets one, sees it
		}
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

// onData adds a DATA frame to its call's message.
func (c *conn) onData(f *http2.DataFrame) http2.ErrCode {
	n := f.Length
	c.connRecvLeft -= int64(n)
	if c.connRecvLeft < 0 {
		return http2.ErrCodeFlowControl
	}
	c.connUnacked += n
	if c.connUnacked >= connWindow/2 {
		unacked := c.connUnacked
		c.connUnacked = 0
		c.connRecvLeft += int64(unacked)
		if c.write(func() error { return c.fr.WriteWindowUpdate(0, unacked) }) != nil {
			return http2.ErrCodeInternal
		}
	}
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
			c.finish(st) // expire has reset it
			return http2.ErrCodeNo
		}
		st.expiry.Reset(min(time.Until(st.bodyDeadline), c.srv.bodyIdle))
	}
	st.recvLeft -= int64(n)
	if st.recvLeft < 0 {
		c.resetStream(id, http2.ErrCodeFlowControl)
		return http2.ErrCodeNo
	}
	st.received += int64(len(f.Data()))
	if st.contentLength >= 0 && st.received > st.contentLength {
		c.resetStream(id, http2.ErrCodeProtocol)
		return http2.ErrCodeNo
	}
	if st.inbox != nil {
		if err := st.inbox.add(f.Data(), c.srv.opts.MaxRecvMsgSize); err != nil {
			c.resetStream(id, http2.ErrCodeEnhanceYourCalm)
			return http2.ErrCodeNo
		}
	} else if st.refusal == nil {
		if size, ok := st.take(f.Data(), c.srv.opts.MaxRecvMsgSize); !ok {
			c.answerEarly(st, errTooLarge(size, c.srv.opts.MaxRecvMsgSize))
			return http2.ErrCodeNo
		}
	}
	if f.StreamEnded() {
		return c.end(st)
	}
	st.unacked += n
	if st.unacked >= initialWindow/2 {
		unacked := st.unacked
		st.unacked = 0
		st.recvLeft += int64(unacked)
		if c.write(func() error { return c.fr.WriteWindowUpdate(id, unacked) }) != nil {
			return http2.ErrCodeInternal
		}
	}
	return http2.ErrCodeNo
}

// take appends a DATA payload to the request. For a call Admit counts, the
// buffer is sized for the whole message once its length is known (not from
// grpc-go's buffer pool, whose size classes would give a 256 KiB message a
// 1 MiB buffer). Past limit it keeps nothing and returns the message's size
// (as announced, or as received so far).
func (st *stream) take(p []byte, limit int) (int, bool) {
	if st.buf == nil && len(p) >= 5 {
		n := int(uint32(p[1])<<24 | uint32(p[2])<<16 | uint32(p[3])<<8 | uint32(p[4]))
		if n > limit {
			return n, false
		}
		size := 5 + n
		if st.admitted == nil {
			// Not counted by Admit (a health check, or no Admit at all):
			// a buffer for what came, not for what is announced, which
			// a client could announce on every stream at little cost.
			size = min(size, max(len(p), 4<<10))
		}
		st.buf = make([]byte, 0, size)
	}
	if len(st.buf)+len(p) > 5+limit {
		return len(st.buf) + len(p) - 5, false
	}
	st.buf = append(st.buf, p...)
	return 0, true
}

// release drops the request's bytes once decoded, so that a flood of
// large requests holds each message once (as decoded), not twice. By the
// goroutine that owns the stream: the reader before dispatch, the handler
// after.
func (st *stream) release() {
	st.buf = nil
}

// end marks st's request whole and dispatches it to a handler, or
// answers a request that is not gRPC.
func (c *conn) end(st *stream) http2.ErrCode {
	st.ended = true
	if st.expiry != nil && !st.expiry.Stop() {
		c.finish(st) // its message came too late: expire reset it
		return http2.ErrCodeNo
	}
	if st.contentLength >= 0 && st.received != st.contentLength {
		c.resetStream(st.id, http2.ErrCodeProtocol)
		return http2.ErrCodeNo
	}
	if st.inbox != nil {
		st.inbox.end()
		return http2.ErrCodeNo
	}
	st.started = true
	if st.refusal != nil {
		// Its body waits for flow control, which the reader must not.
		c.srv.handlers.Add(1)
		go c.answerHTTP(st)
		return http2.ErrCodeNo
	}
	c.srv.dispatch(st)
	return http2.ErrCodeNo
}

// finish forgets st: its handler returned, or it never had one. It closes
// a draining connection whose last stream this was.
func (c *conn) finish(st *stream) {
	c.smu.Lock()
	if c.streams[st.id] != st {
		c.smu.Unlock()
		return // finished already
	}
	delete(c.streams, st.id)
	done := c.draining && len(c.streams) == 0
	c.smu.Unlock()
	if !st.started {
		st.release() // the handler releases its own
	}
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
// deadline, or whose DATA stopped coming (see bodyTimeout), and gives its
// place in Admit back at once. It runs on the timer's goroutine and leaves
// the stream's buffer and entry to the reader, which sees the timer fired
// (Stop false) when the client sends on the stream again, or drops them
// with the connection.
func (c *conn) expire(st *stream) {
	st.admitDone()
	st.cancel()
	c.writeReset(st, st.id, http2.ErrCodeCancel)
}

func (c *conn) onSettings(f *http2.SettingsFrame) http2.ErrCode {
	if f.IsAck() {
		return http2.ErrCodeNo
	}
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

// writeReset sends RST_STREAM for stream id, and marks st (if any) reset so
// that its writers stop.
func (c *conn) writeReset(st *stream, id uint32, code http2.ErrCode) {
	c.write(func() error {
		if st != nil {
			st.reset = true
			c.wcond.Broadcast()
		}
		return c.fr.WriteRSTStream(id, code)
	})
}

// drain starts a graceful close: a GOAWAY that lets streams in flight
// finish, and a PING; when its answer is back, every stream the client
// opened before the GOAWAY has arrived, and a second GOAWAY names the last.
// A client that does not answer gets the second GOAWAY after a second.
func (c *conn) drain() {
	c.wmu.Lock()
	if c.goAwaySent || c.closed {
		c.wmu.Unlock()
		return
	}
	c.goAwaySent = true
	c.wmu.Unlock()
	// Armed first: the GOAWAY may wait for a client that does not read.
	c.after(time.Second, c.goAwayFinal)
	if grace := c.srv.opts.MaxConnectionAgeGrace; grace > 0 {
		c.after(grace+time.Second, c.close)
	}
	c.writeControl(func() error {
		if err := c.fr.WriteGoAway(math.MaxInt32, http2.ErrCodeNo, nil); err != nil {
			return err
		}
		return c.fr.WritePing(false, pingData(goAwayPing))
	})
}

// after runs f in d, unless the connection closes first.
func (c *conn) after(d time.Duration, f func()) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.closed {
		c.timers = append(c.timers, time.AfterFunc(d, f))
	}
}

// goAwayFinal sends the GOAWAY naming the last stream served, and closes
// the connection if none is in flight.
func (c *conn) goAwayFinal() {
	c.smu.Lock()
	if c.draining {
		c.smu.Unlock()
		return
	}
	c.draining = true
	// The reader is the only writer of maxStreamID; a stream it reads
	// after this is past lastID and dropped, and the client retries it.
	c.lastID = c.maxStreamID.Load()
	lastID, idle := c.lastID, len(c.streams) == 0
	c.smu.Unlock()
	c.writeControl(func() error { return c.fr.WriteGoAway(lastID, http2.ErrCodeNo, nil) })
	if idle {
		c.close()
	}
}

// goAwayNow ends the connection for a protocol error.
func (c *conn) goAwayNow(code http2.ErrCode) {
	c.writeControl(func() error { return c.fr.WriteGoAway(c.maxStreamID.Load(), code, nil) })
}

// close closes the connection, after writing what is pending (with a
// short deadline: a client that does not read is not waited for); calls in
// flight see their contexts canceled.
func (c *conn) close() {
	c.wmu.Lock()
	already := c.closed
	c.closed = true
	pending, timers := c.out, c.timers
	c.out, c.timers = nil, nil
	c.wcond.Broadcast()
	c.wmu.Unlock()
	if already {
		return
	}
	for _, t := range timers {
		t.Stop()
	}
	c.cancel()
	c.smu.Lock()
	c.gone = true
	for _, st := range c.streams {
		if st.cancel != nil {
			st.cancel()
		}
		// A stream whose message had not come whole has no handler to
		// give its place back; a handler still running is told by its
		// context, and its place is not the closed connection's to keep.
		st.admitDone()
		if st.expiry != nil {
			st.expiry.Stop()
		}
	}
	c.smu.Unlock()
	if len(pending) > 0 {
		c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		c.netMu.Lock()
		c.nc.Write(pending)
		c.netMu.Unlock()
	}
	c.nc.Close()
}

// errClosed is the error of a write on a closed connection.
var errClosed = errors.New("grpcunary: connection closed")

// maxPending bounds the bytes waiting for the flusher: past it, writers
// wait, the reader among them, so a client that does not read its answers
// stops being read.
const maxPending = 1 << 20

// write runs fn with the write side held; the frames fn writes go out
// with the flusher's next write.
func (c *conn) write(fn func() error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for len(c.out) > maxPending && !c.closed {
		c.wcond.Wait()
	}
	return c.writeLocked(fn)
}

// writeControl is write for the few frames that end a connection
// (GOAWAY): they do not wait for pending bytes to go, so that a drain is
// not held up by a client that does not read (the flusher's write
// deadline closes that one).
func (c *conn) writeControl(fn func() error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(fn)
}

// writeLocked runs fn (wmu held) unless the connection is closed.
func (c *conn) writeLocked(fn func() error) error {
	if c.closed {
		return errClosed
	}
	err := fn()
	c.queueFlush()
	return err
}

// writeTimeout bounds one write of the flusher: a client that leaves its
// answers unread that long is closed, which ends the writers waiting on it.
const writeTimeout = 10 * time.Second

// queueFlush wakes the flusher if frames wait (wmu held).
func (c *conn) queueFlush() {
	if len(c.out) > 0 && !c.flushQueued {
		c.flushQueued = true
		c.flush <- struct{}{}
	}
}

// flusher writes the frames the connection's writers leave in out. Woken,
// it first yields the processor, as grpc-go's writer does: the handlers
// runnable then add their answers, and one system call sends them all.
func (c *conn) flusher() {
	for {
		select {
		case <-c.flush:
		case <-c.ctx.Done():
			return
		}
		runtime.Gosched()
		c.wmu.Lock()
		buf := c.out
		c.out, c.spare = c.spare[:0], nil
		c.flushQueued = false
		if len(buf) == 0 {
			c.wmu.Unlock()
			continue
		}
		// Under wmu: close, which shortens the deadline, comes after.
		c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
		c.netMu.Lock()
		c.wmu.Unlock()
		_, err := c.nc.Write(buf)
		c.netMu.Unlock()
		if err != nil {
			c.close()
			return
		}
		c.wmu.Lock()
		if cap(buf) <= 4*bufferSize {
			c.spare = buf[:0]
		}
		c.wcond.Broadcast()
		c.wmu.Unlock()
	}
}

// outWriter is the framer's writer: frames go to out (wmu held).
type outWriter struct{ c *conn }

func (w outWriter) Write(p []byte) (int, error) {
	w.c.out = append(w.c.out, p...)
	return len(p), nil
}

func pingData(v uint64) (d [8]byte) {
	for i := range d {
		d[7-i] = byte(v >> (8 * i))
	}
	return d
}
