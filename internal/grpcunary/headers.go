package grpcunary

import (
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// headerBlock is a HEADERS frame and its CONTINUATIONs being read.
type headerBlock struct {
	streamID  uint32
	endStream bool
	selfDep   bool // the stream depends on itself (a stream error)
	size      int  // encoded bytes so far (maxHeaderBlockBytes)
}

// Pseudo-headers of a request, as bits of headerParser.pseudo.
const (
	pseudoMethod = 1 << iota
	pseudoScheme
	pseudoPath
	pseudoAuthority
)

// headerParser reads a header block as the hpack decoder emits its
// fields: it checks what HTTP/2 asks of a request (RFC 9113, 8.2 and 8.3)
// and keeps what a call needs, with no slice of fields per request.
// Metadata are the headers but for pseudo-headers and those gRPC itself
// uses (user-agent and :authority are kept), "-bin" values base64-decoded,
// as grpc-go's server gives them.
type headerParser struct {
	req                         request
	method, scheme, contentType string
	pseudo                      int
	regular                     bool // a regular field came: no pseudo-header may follow
	size                        int  // the list's size as HTTP/2 counts it
	truncated                   bool // past MaxHeaderListSize
	err                         error
	md                          []hpack.HeaderField // reused: the metadata map is built once
}

func (p *headerParser) reset() {
	md := p.md[:0]
	*p = headerParser{req: request{timeout: -1, contentLength: -1}, md: md}
}

// field takes one decoded field.
func (p *headerParser) field(f hpack.HeaderField) {
	if p.truncated {
		return
	}
	if p.size += int(f.Size()); p.size > MaxHeaderListSize {
		p.truncated = true
		return
	}
	if p.err != nil {
		return
	}
	if f.IsPseudo() {
		p.pseudoField(f)
		return
	}
	p.regular = true
	if !validFieldName(f.Name) || !httpguts.ValidHeaderFieldValue(f.Value) {
		p.err = errMalformed
		return
	}
	switch f.Name {
	case "connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade":
		p.err = errMalformed // HTTP/1 connection headers
	case "te":
		if f.Value != "trailers" {
			p.err = errMalformed
		}
	case "content-length":
		n, err := strconv.ParseUint(f.Value, 10, 63)
		if err != nil {
			p.err = errMalformed
		}
		p.req.contentLength = int64(n)
	case "content-type":
		p.contentType = f.Value
	case "grpc-timeout":
		d, ok := parseTimeout(f.Value)
		if !ok {
			p.err = status.Errorf(codes.Internal, "malformed grpc-timeout %q", f.Value)
		}
		p.req.timeout = d
	case "grpc-encoding":
		if f.Value != "identity" {
			p.err = status.Errorf(codes.Unimplemented, "grpc: Decompressor is not installed for grpc-encoding %q", f.Value)
		}
	default:
		if reserved(f.Name) {
			return
		}
		if strings.HasSuffix(f.Name, "-bin") {
			b, err := decodeBinary(f.Value)
			if err != nil {
				p.err = status.Errorf(codes.Internal, "malformed binary metadata %q: %v", f.Name, err)
				return
			}
			f.Value = string(b)
		}
		p.md = append(p.md, f)
	}
}

func (p *headerParser) pseudoField(f hpack.HeaderField) {
	var bit int
	switch f.Name {
	case ":method":
		bit, p.method = pseudoMethod, f.Value
	case ":scheme":
		bit, p.scheme = pseudoScheme, f.Value
	case ":path":
		bit, p.req.path = pseudoPath, f.Value
	case ":authority":
		bit = pseudoAuthority
		p.md = append(p.md, f)
	}
	if bit == 0 || p.regular || p.pseudo&bit != 0 {
		p.err = errMalformed // unknown, after a regular field, or twice
		return
	}
	p.pseudo |= bit
}

// result is the request the block held, or why it is refused.
func (p *headerParser) result() (request, error) {
	if p.err != nil {
		return p.req, p.err
	}
	if p.method == "" || p.scheme == "" || p.req.path == "" {
		return p.req, errMalformed
	}
	if !isGRPC(p.contentType) {
		return p.req, &httpError{status: 415, msg: "content-type " + strconv.Quote(p.contentType) + " is not gRPC"}
	}
	if p.method != "POST" {
		return p.req, &httpError{status: 405, msg: "method " + strconv.Quote(p.method) + ": gRPC calls are POSTs"}
	}
	if len(p.md) > 0 {
		// One map and one array of values for all keys.
		md := make(metadata.MD, len(p.md))
		values := make([]string, len(p.md))
		for i, f := range p.md {
			values[i] = f.Value
			if prev := md[f.Name]; prev != nil {
				md[f.Name] = append(prev[:len(prev):len(prev)], f.Value)
			} else {
				md[f.Name] = values[i : i+1 : i+1]
			}
		}
		p.req.md = md
	}
	return p.req, nil
}

// validFieldName reports a regular field name HTTP/2 allows: an HTTP token
// in lower case.
func validFieldName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if b := name[i]; 'A' <= b && b <= 'Z' || !httpguts.IsTokenRune(rune(b)) {
			return false
		}
	}
	return true
}
