package conformance

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
)

// rawRequest sends one remoting request with a body to addr on a fresh
// connection and returns the answer's code and remark: a client's request
// without the client, for a request the client gives up on before sending
// (a send to a topic it has no route for). Frame: total length, header
// length (serialize type 0, JSON, in the high byte), header, body.
func rawRequest(ctx context.Context, addr string, code int, body []byte, ext map[string]string) (int, string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, "", err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	type header struct {
		Code      int               `json:"code"`
		Language  string            `json:"language"`
		Version   int               `json:"version"`
		Opaque    int32             `json:"opaque"`
		Flag      int               `json:"flag"`
		Remark    string            `json:"remark"`
		ExtFields map[string]string `json:"extFields"`
	}
	hb, err := json.Marshal(header{Code: code, Language: "GO", Version: 317, Opaque: 1, ExtFields: ext})
	if err != nil {
		return 0, "", err
	}
	frame := make([]byte, 8, 8+len(hb)+len(body))
	binary.BigEndian.PutUint32(frame[0:4], uint32(4+len(hb)+len(body)))
	binary.BigEndian.PutUint32(frame[4:8], uint32(len(hb)))
	frame = append(append(frame, hb...), body...)
	if _, err := conn.Write(frame); err != nil {
		return 0, "", err
	}
	var n [4]byte
	if _, err := io.ReadFull(conn, n[:]); err != nil {
		return 0, "", err
	}
	buf := make([]byte, binary.BigEndian.Uint32(n[:]))
	if _, err := io.ReadFull(conn, buf); err != nil {
		return 0, "", err
	}
	if len(buf) < 4 {
		return 0, "", fmt.Errorf("short answer from %s", addr)
	}
	hl := int(binary.BigEndian.Uint32(buf[0:4]) & 0xFFFFFF)
	if 4+hl > len(buf) {
		return 0, "", fmt.Errorf("bad header length %d from %s", hl, addr)
	}
	var resp header
	if err := json.Unmarshal(buf[4:4+hl], &resp); err != nil {
		return 0, "", fmt.Errorf("answer from %s: %w", addr, err)
	}
	return resp.Code, resp.Remark, nil
}
