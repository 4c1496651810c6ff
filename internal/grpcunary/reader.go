package grpcunary

import (
	"context"
	"errors"
	"math"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The read side of a connection: one goroutine per connection reads its
// frames and acts on each in turn. It never runs a handler: a unary call
// is dispatched once its message is whole (stream.go), so a slow handler
// does not hold the connection's other streams.

// connReader is the reader goroutine's state.
type connReader struct {
	hdec  *hpack.Decoder
	hp    headerParser
	block headerBlock
	flow  recvWindow // the connection's receive window (flow.go)
	// maxStreamID is the highest stream id the client opened: written by
	// the reader only, read by the drain.
	maxStreamID atomic.Uint32
	// PINGs and SETTINGS to answer since the last call or second.
	controls     int
	controlsFrom time.Time
}

// readLoop reads frames until the connection fails or a connection error
// ends it, with a GOAWAY when the error is the client's.
func (c *conn) readLoop() {
	first := true
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			if first && errors.Is(err, os.ErrDeadlineExceeded) {
				c.refuse(RefusedHandshake)
			}
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
			// Fails only on a closed connection, which the next read reports.
			_ = c.nc.SetReadDeadline(time.Time{})
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
		c.refuse(RefusedHeaderBlock)
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
	case open >= int(c.srv.opts.MaxConcurrentStreams):
		c.refuse(RefusedStreams)
		c.resetStream(id, http2.ErrCodeRefusedStream)
		return http2.ErrCodeNo
	case !c.canHold(streamCost + int64(c.hp.size)):
		c.refuse(RefusedStreamBytes)
		c.resetStream(id, http2.ErrCodeRefusedStream)
		return http2.ErrCodeNo
	}
	req, err := c.hp.result()
	if errors.Is(err, errMalformed) {
		c.resetStream(id, http2.ErrCodeProtocol)
		return http2.ErrCodeNo
	}

	// peerWindow changes on the reader goroutine only (onSettings).
	st := &stream{
		c: c, id: id, contentLength: req.contentLength,
		window:     recvWindow{left: initialWindow - 1, size: initialWindow},
		sendWindow: c.peerWindow,
	}
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

// onData adds a DATA frame to its call's message.
func (c *conn) onData(f *http2.DataFrame) http2.ErrCode {
	n := int64(f.Length)
	if !c.flow.take(n) {
		return http2.ErrCodeFlowControl
	}
	// The connection's window goes back at once, whatever becomes of the
	// stream (flow.go).
	if c.giveBack(0, &c.flow, n) != nil {
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
		c.refuse(RefusedStreamBytes)
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
			c.refuse(RefusedMessageSize)
			c.answerEarly(st, errTooLarge(size, c.srv.opts.MaxRecvMsgSize))
			return http2.ErrCodeNo
		}
	}
	if f.StreamEnded() {
		return c.end(st)
	}
	if c.giveBack(id, &st.window, n) != nil {
		return http2.ErrCodeInternal
	}
	return http2.ErrCodeNo
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
		c.refuse(RefusedControlFlood)
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
	// The write fails only once the connection is closed: no window to grow.
	_ = c.write(func() error {
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
	// The write fails only once the connection is closed: nothing to stop.
	_ = c.write(func() error {
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
