package grpcunary

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// request is what a call's headers say.
type request struct {
	path          string
	timeout       time.Duration // negative: none
	contentLength int64         // negative: none
	md            metadata.MD
}

// errMalformed is a request HTTP/2 calls malformed (RFC 9113, 8.1.1): its
// stream is reset with PROTOCOL_ERROR.
var errMalformed = errors.New("malformed request")

// httpError answers a request that is not gRPC with an HTTP status.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func reserved(name string) bool {
	switch name {
	case "grpc-message-type", "grpc-message", "grpc-status", "grpc-status-details-bin":
		return true
	}
	return false
}

// isGRPC reports a gRPC content type with the proto codec (the one codec
// a Server has).
func isGRPC(ct string) bool {
	sub, ok := strings.CutPrefix(ct, "application/grpc")
	if !ok {
		return false
	}
	if i := strings.IndexByte(sub, ';'); i >= 0 {
		sub = sub[:i]
	}
	return sub == "" || sub == "+proto"
}

func decodeBinary(v string) ([]byte, error) {
	if len(v)%4 == 0 {
		return base64.StdEncoding.DecodeString(v)
	}
	return base64.RawStdEncoding.DecodeString(v)
}

// parseTimeout reads a grpc-timeout value: at most 8 digits and a unit.
func parseTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseUint(v[:len(v)-1], 10, 64)
	if err != nil {
		return 0, false
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	if n > uint64(1<<62)/uint64(unit) {
		return 1 << 62, true
	}
	return time.Duration(n) * unit, true
}

func newIncomingContext(ctx context.Context, md metadata.MD) context.Context {
	return metadata.NewIncomingContext(ctx, md)
}

// lookup finds st's method, or says why there is none as grpc-go does.
func (s *Server) lookup(st *stream) error {
	m := s.methods[st.path]
	if m == nil {
		service, name, ok := strings.Cut(strings.TrimPrefix(st.path, "/"), "/")
		if !ok {
			return status.Errorf(codes.Unimplemented, "malformed method name: %q", st.path)
		}
		for path := range s.methods {
			if strings.HasPrefix(path, "/"+service+"/") {
				return status.Errorf(codes.Unimplemented, "unknown method %v for service %v", name, service)
			}
		}
		return status.Errorf(codes.Unimplemented, "unknown service %v", service)
	}
	st.method = m
	return nil
}

func errTooLarge(size, max int) error {
	return status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", size-5, max)
}

// handle runs st's handler and writes its answer.
func (c *conn) handle(st *stream) {
	defer c.srv.handlers.Done()
	defer c.finish(st)
	resp, err := c.call(st)
	st.release() // if the handler never decoded its request
	// The work Admit bounds is done: a client slow to take the answer does
	// not keep the place.
	st.admitDone()
	if err != nil {
		sts, ok := status.FromError(err)
		if !ok {
			sts = status.FromContextError(err)
		}
		c.writeStatus(st, sts)
		return
	}
	data, err := c.srv.codec.Marshal(resp)
	if err != nil {
		c.writeStatus(st, status.Newf(codes.Internal, "grpc: error while marshaling: %v", err))
		return
	}
	c.writeAnswer(st, data)
	data.Free()
}

func (c *conn) call(st *stream) (any, error) {
	b := st.buf
	if len(b) < 5 {
		return nil, status.Error(codes.Internal, "grpc: a unary call without its request message")
	}
	if b[0] != 0 {
		return nil, status.Error(codes.Unimplemented, "grpc: compressed messages are not served (no grpc-encoding)")
	}
	if n := int(uint32(b[1])<<24 | uint32(b[2])<<16 | uint32(b[3])<<8 | uint32(b[4])); n != len(b)-5 {
		return nil, status.Errorf(codes.Internal, "grpc: a unary call carries one message: %d bytes announced, %d sent", n, len(b)-5)
	}
	dec := func(v any) error {
		// The codecs copy what they keep: the bytes go back at once, not
		// after the decision.
		if st.buf == nil {
			return status.Error(codes.Internal, "grpc: the request was decoded already")
		}
		err := c.srv.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(st.buf[5:])}, v)
		st.release()
		if err != nil {
			return status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
		}
		return nil
	}
	return st.method.handler(st.method.impl, st.ctx, dec, c.srv.interceptor)
}

// writeAnswer writes a successful answer: headers, the message, trailers.
func (c *conn) writeAnswer(st *stream, msg mem.BufferSlice) {
	size := 5 + msg.Len()
	// The write fails only once the connection is closed, which the client sees.
	_ = c.write(func() error {
		if st.reset {
			return nil
		}
		c.hbuf.Reset()
		c.henc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
		c.henc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
		if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true}); err != nil {
			return err
		}
		// c.data serves a message the windows let go at once: the lock is
		// then held throughout. One that may wait gets its own buffer,
		// since others write while it waits.
		fits := c.fits(st, size)
		buf := c.data[:0]
		if !fits {
			buf = make([]byte, 0, size)
		}
		n := size - 5
		buf = append(buf, 0, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
		for _, b := range msg {
			buf = append(buf, b.ReadOnlyData()...)
		}
		if fits && cap(buf) <= 64<<10 {
			c.data = buf[:0]
		}
		if err := c.sendData(st, buf, false); err != nil || st.reset {
			return err
		}
		c.hbuf.Reset()
		c.henc.WriteField(hpack.HeaderField{Name: "grpc-status", Value: "0"})
		st.reset = true
		return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: c.hbuf.Bytes(), EndStream: true, EndHeaders: true})
	})
}

func truncate(msg string) string {
	if len(msg) > maxStatusMessage {
		return msg[:maxStatusMessage]
	}
	return msg
}

// writeStatus answers st with a status alone (trailers-only).
func (c *conn) writeStatus(st *stream, sts *status.Status) {
	// The write fails only once the connection is closed, which the client sees.
	_ = c.write(func() error {
		if st.reset {
			return nil
		}
		st.reset = true
		return c.writeTrailersOnly(st.id, sts)
	})
}

func (c *conn) writeTrailersOnly(id uint32, sts *status.Status) error {
	c.hbuf.Reset()
	c.henc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
	c.henc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
	c.henc.WriteField(hpack.HeaderField{Name: "grpc-status", Value: strconv.Itoa(int(sts.Code())), Sensitive: false})
	if msg := sts.Message(); msg != "" {
		c.henc.WriteField(hpack.HeaderField{Name: "grpc-message", Value: encodeGRPCMessage(truncate(msg))})
	}
	if p := sts.Proto(); len(p.GetDetails()) > 0 {
		if b, err := proto.Marshal(p); err == nil && len(b) < 8<<10 {
			c.henc.WriteField(hpack.HeaderField{Name: "grpc-status-details-bin", Value: base64.RawStdEncoding.EncodeToString(b)})
		}
	}
	return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndStream: true, EndHeaders: true})
}

// answerHTTP answers a request that is not gRPC, once it has come whole,
// with its HTTP status and a line saying why, and forgets it.
func (c *conn) answerHTTP(st *stream) {
	defer c.srv.handlers.Done()
	// The write fails only once the connection is closed, which the client sees.
	_ = c.write(func() error {
		if st.reset {
			return nil
		}
		body := []byte(st.refusal.msg + "\n")
		c.hbuf.Reset()
		c.henc.WriteField(hpack.HeaderField{Name: ":status", Value: strconv.Itoa(st.refusal.status)})
		c.henc.WriteField(hpack.HeaderField{Name: "content-type", Value: "text/plain; charset=utf-8"})
		c.henc.WriteField(hpack.HeaderField{Name: "content-length", Value: strconv.Itoa(len(body))})
		if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true}); err != nil {
			return err
		}
		err := c.sendData(st, body, true)
		st.reset = true
		return err
	})
	c.finish(st)
}

// answerEarly answers a call refused before its handler (unknown method,
// message too large, refused by the AdmitFunc), resets it if the client is
// still sending, and forgets it.
func (c *conn) answerEarly(st *stream, err error) {
	// The write fails only once the connection is closed, which the client sees.
	_ = c.write(func() error {
		if st.reset {
			return nil
		}
		st.reset = true
		werr := c.writeTrailersOnly(st.id, status.Convert(err))
		if werr == nil && !st.ended {
			werr = c.fr.WriteRSTStream(st.id, http2.ErrCodeNo)
		}
		return werr
	})
	c.finish(st)
}

// encodeGRPCMessage percent-encodes what gRPC's grpc-message may not
// carry as is: bytes outside printable ASCII, and '%'.
func encodeGRPCMessage(msg string) string {
	clean := true
	for i := 0; i < len(msg); i++ {
		if b := msg[i]; b < ' ' || b > '~' || b == '%' {
			clean = false
			break
		}
	}
	if clean {
		return msg
	}
	var sb strings.Builder
	for i := 0; i < len(msg); i++ {
		if b := msg[i]; b < ' ' || b > '~' || b == '%' {
			fmt.Fprintf(&sb, "%%%02X", b)
		} else {
			sb.WriteByte(b)
		}
	}
	return sb.String()
}
