package grpcunary

import (
	"context"
	"encoding/base64"
	"io"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Streaming methods (server reflection, health's Watch) are served too, more
// simply than unary calls: their handler starts with the call's headers and
// reads messages as they come. They are rare and small, so an inbox past
// its bound resets the stream rather than holding the client back by flow
// control.

// inbox holds a streaming call's messages until its handler reads them.
type inbox struct {
	mu      sync.Mutex
	ready   chan struct{} // signaled when a message or the end arrives
	msgs    [][]byte
	size    int
	ended   bool
	partial []byte // the reader's: bytes of a message not yet whole
}

// add takes a DATA payload (reader goroutine); an error resets the stream.
func (in *inbox) add(p []byte, max int) error {
	in.partial = append(in.partial, p...)
	for len(in.partial) >= 5 {
		b := in.partial
		if b[0] != 0 {
			return status.Error(codes.Unimplemented, "grpc: compressed messages are not served (no grpc-encoding)")
		}
		n := int(uint32(b[1])<<24 | uint32(b[2])<<16 | uint32(b[3])<<8 | uint32(b[4]))
		if n > max {
			return errTooLarge(5+n, max)
		}
		if len(b) < 5+n {
			break
		}
		msg := make([]byte, n)
		copy(msg, b[5:5+n])
		in.partial = b[5+n:]
		in.mu.Lock()
		in.msgs = append(in.msgs, msg)
		in.size += n
		full := in.size > 2*max
		in.mu.Unlock()
		if full {
			return status.Error(codes.ResourceExhausted, "grpc: the client sends faster than the method reads")
		}
		in.signal()
	}
	if len(in.partial) == 0 {
		in.partial = nil
	}
	return nil
}

// end marks the client's side over (reader goroutine).
func (in *inbox) end() {
	in.mu.Lock()
	in.ended = true
	in.mu.Unlock()
	in.signal()
}

func (in *inbox) signal() {
	select {
	case in.ready <- struct{}{}:
	default:
	}
}

// next returns the next message, io.EOF after the last, or the context's
// error.
func (in *inbox) next(ctx context.Context) ([]byte, error) {
	for {
		in.mu.Lock()
		if len(in.msgs) > 0 {
			msg := in.msgs[0]
			in.msgs[0] = nil
			in.msgs = in.msgs[1:]
			in.size -= len(msg)
			in.mu.Unlock()
			return msg, nil
		}
		ended := in.ended
		in.mu.Unlock()
		if ended {
			return nil, io.EOF
		}
		select {
		case <-in.ready:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}

// serverStream is a streaming call's grpc.ServerStream.
type serverStream struct {
	c  *conn
	st *stream
	// Guarded by the connection's wmu.
	header, trailer metadata.MD
	headerSent      bool
}

var _ grpc.ServerStream = (*serverStream)(nil)

func (ss *serverStream) Context() context.Context { return ss.st.ctx }

func (ss *serverStream) SetHeader(md metadata.MD) error {
	return ss.c.write(func() error {
		if ss.headerSent {
			return status.Error(codes.Internal, "grpc: the headers were sent already")
		}
		ss.header = metadata.Join(ss.header, md)
		return nil
	})
}

func (ss *serverStream) SendHeader(md metadata.MD) error {
	return ss.c.write(func() error {
		if ss.headerSent {
			return status.Error(codes.Internal, "grpc: the headers were sent already")
		}
		ss.header = metadata.Join(ss.header, md)
		return ss.writeHeader()
	})
}

func (ss *serverStream) SetTrailer(md metadata.MD) {
	// The write fails only once the connection is closed: no trailers go.
	_ = ss.c.write(func() error {
		ss.trailer = metadata.Join(ss.trailer, md)
		return nil
	})
}

// writeHeader sends the response headers (wmu held).
func (ss *serverStream) writeHeader() error {
	if ss.st.reset {
		return ss.done()
	}
	ss.headerSent = true
	c := ss.c
	c.hbuf.Reset()
	c.henc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
	c.henc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
	encodeMD(c.henc, ss.header)
	return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: ss.st.id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
}

// done is the error of a send on a stream that is over.
func (ss *serverStream) done() error {
	if err := ss.st.ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Canceled, "grpc: the stream is over")
}

func (ss *serverStream) SendMsg(m any) error {
	data, err := ss.c.srv.codec.Marshal(m)
	if err != nil {
		return status.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
	}
	defer data.Free()
	buf := make([]byte, 5, 5+data.Len())
	n := data.Len()
	buf[1], buf[2], buf[3], buf[4] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	for _, b := range data {
		buf = append(buf, b.ReadOnlyData()...)
	}
	return ss.c.write(func() error {
		if !ss.headerSent {
			if err := ss.writeHeader(); err != nil {
				return err
			}
		}
		if ss.st.reset {
			return ss.done()
		}
		if err := ss.c.sendData(ss.st, buf, false); err != nil {
			return err
		}
		if ss.st.reset {
			return ss.done()
		}
		return nil
	})
}

func (ss *serverStream) RecvMsg(m any) error {
	msg, err := ss.st.inbox.next(ss.st.ctx)
	if err != nil {
		return err
	}
	ss.c.unhold(ss.st.held.put(5 + int64(len(msg))))
	if err := ss.c.srv.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(msg)}, m); err != nil {
		return status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
	}
	return nil
}

// handleStream runs a streaming call's handler and writes its status.
func (c *conn) handleStream(st *stream) {
	defer c.srv.handlers.Done()
	defer c.finish(st)
	ss := &serverStream{c: c, st: st}
	err := st.method.stream(st.method.impl, ss)
	sts, ok := status.FromError(err)
	if !ok {
		sts = status.FromContextError(err)
	}
	// The write fails only once the connection is closed, which the client sees.
	_ = c.write(func() error {
		if st.reset {
			return nil
		}
		st.reset = true
		var werr error
		if !ss.headerSent {
			werr = c.writeTrailersOnly(st.id, sts)
		} else {
			c.hbuf.Reset()
			c.henc.WriteField(hpack.HeaderField{Name: "grpc-status", Value: strconv.Itoa(int(sts.Code()))})
			if msg := sts.Message(); msg != "" {
				c.henc.WriteField(hpack.HeaderField{Name: "grpc-message", Value: encodeGRPCMessage(truncate(msg))})
			}
			encodeMD(c.henc, ss.trailer)
			werr = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: c.hbuf.Bytes(), EndStream: true, EndHeaders: true})
		}
		if werr == nil && !st.inbox.closed() {
			werr = c.fr.WriteRSTStream(st.id, http2.ErrCodeNo) // the client need not send more
		}
		return werr
	})
}

func (in *inbox) closed() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.ended
}

// encodeMD writes metadata as header fields, "-bin" values base64-encoded.
func encodeMD(enc *hpack.Encoder, md metadata.MD) {
	for k, vs := range md {
		if reserved(k) || strings.HasPrefix(k, ":") {
			continue
		}
		for _, v := range vs {
			if strings.HasSuffix(k, "-bin") {
				v = base64.RawStdEncoding.EncodeToString([]byte(v))
			}
			enc.WriteField(hpack.HeaderField{Name: k, Value: v})
		}
	}
}
