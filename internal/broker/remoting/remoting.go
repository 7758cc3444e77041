// Package remoting speaks just enough of RocketMQ's remoting protocol (one
// request, one response, JSON headers) for what rocketmq-client-go has no
// public API for: a topic's broker addresses from the name server, and the
// broker's query by key. Values never go into anything but the request's
// header fields.
package remoting

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"sort"
	"strconv"
	"sync/atomic"
	"time"
)

// Request and response codes used by rmqtx.
const (
	ReqQueryMessage  = 12
	ReqCreateTopic   = 17
	ReqGetRouteInfo  = 105
	ResSuccess       = 0
	ResTopicNotExist = 17
	ResQueryNotFound = 22
	maxFrame         = 64 << 20
	remotingVersion  = 317
)

// ErrTopicNotFound is returned when the name server knows no route for a topic.
var ErrTopicNotFound = errors.New("remoting: topic not found on the name server")

var opaqueSeq atomic.Int32

// Header is a remoting command header (JSON serialisation).
type Header struct {
	Code      int               `json:"code"`
	Language  string            `json:"language"`
	Version   int               `json:"version"`
	Opaque    int32             `json:"opaque"`
	Flag      int               `json:"flag"`
	Remark    string            `json:"remark"`
	ExtFields map[string]string `json:"extFields"`
}

// RoundTrip sends one request to addr on a fresh connection and reads its
// response (timeout <= 0 means 5 s).
func RoundTrip(ctx context.Context, addr string, timeout time.Duration, code int, ext map[string]string) (Header, []byte, error) {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return Header{}, nil, fmt.Errorf("remoting: dial %s: %w", addr, err)
	}
	defer conn.Close()
	return exchange(ctx, conn, bufio.NewReader(conn), addr, code, ext)
}

// exchange writes one request on conn and reads its response from r,
// within ctx's deadline. The response must carry the request's opaque: on
// a connection that is reused (Pool), anything else means the stream is out
// of step, and the caller must close it.
func exchange(ctx context.Context, conn net.Conn, r *bufio.Reader, addr string, code int, ext map[string]string) (Header, []byte, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	h := Header{Code: code, Language: "GO", Version: remotingVersion, Opaque: opaqueSeq.Add(1), ExtFields: ext}
	hb, err := json.Marshal(h)
	if err != nil {
		return Header{}, nil, fmt.Errorf("remoting: encode: %w", err)
	}
	frame := make([]byte, 8+len(hb))
	binary.BigEndian.PutUint32(frame[0:4], uint32(4+len(hb)))
	binary.BigEndian.PutUint32(frame[4:8], uint32(len(hb))&0xFFFFFF) // serialize type 0: JSON
	copy(frame[8:], hb)
	if _, err := conn.Write(frame); err != nil {
		return Header{}, nil, fmt.Errorf("remoting: write to %s: %w", addr, err)
	}
	var lenBuf [4]byte
	if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
		return Header{}, nil, fmt.Errorf("remoting: read from %s: %w", addr, err)
	}
	n := binary.BigEndian.Uint32(lenBuf[:])
	if n < 4 || n > maxFrame {
		return Header{}, nil, fmt.Errorf("remoting: bad frame length %d from %s", n, addr)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return Header{}, nil, fmt.Errorf("remoting: read from %s: %w", addr, err)
	}
	mark := binary.BigEndian.Uint32(buf[0:4])
	if mark>>24 != 0 {
		return Header{}, nil, fmt.Errorf("remoting: %s answered in serialize type %d, want JSON", addr, mark>>24)
	}
	hl := int(mark & 0xFFFFFF)
	if 4+hl > len(buf) {
		return Header{}, nil, fmt.Errorf("remoting: bad header length %d from %s", hl, addr)
	}
	var resp Header
	if err := json.Unmarshal(buf[4:4+hl], &resp); err != nil {
		return Header{}, nil, fmt.Errorf("remoting: decode header from %s: %w", addr, err)
	}
	if resp.Opaque != h.Opaque {
		return Header{}, nil, fmt.Errorf("%w: %s answered opaque %d to request %d", errOutOfStep, addr, resp.Opaque, h.Opaque)
	}
	return resp, buf[4+hl:], nil
}

var errOutOfStep = errors.New("remoting: response does not answer the request")

var brokerAddrsRE = regexp.MustCompile(`"brokerAddrs"\s*:\s*\{([^}]*)\}`)
var addrEntryRE = regexp.MustCompile(`"?(\d+)"?\s*:\s*"([^"]+)"`)

// MasterBrokers returns the master broker addresses that serve topic, from
// the first name server that answers (GET_ROUTEINFO_BY_TOPIC). A topic the
// name server does not know gives an error wrapping ErrTopicNotFound.
func MasterBrokers(ctx context.Context, nameServers []string, timeout time.Duration, topic string) ([]string, error) {
	body, err := routeBody(ctx, nameServers, timeout, topic)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range brokerAddrsRE.FindAllSubmatch(body, -1) {
		for _, e := range addrEntryRE.FindAllSubmatch(m[1], -1) {
			if string(e[1]) == "0" { // master
				out = append(out, string(e[2]))
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// routeBody returns topic's route (GET_ROUTEINFO_BY_TOPIC's body) from the
// first name server that answers. A topic the name server does not know
// gives an error wrapping ErrTopicNotFound at once; another failure moves
// on to the next name server, and the last one's error is returned.
func routeBody(ctx context.Context, nameServers []string, timeout time.Duration, topic string) ([]byte, error) {
	var lastErr error
	for _, ns := range nameServers {
		h, body, err := RoundTrip(ctx, ns, timeout, ReqGetRouteInfo, map[string]string{"topic": topic})
		if err != nil {
			lastErr = err
			continue
		}
		if h.Code == ResTopicNotExist {
			return nil, fmt.Errorf("%w: %s", ErrTopicNotFound, topic)
		}
		if h.Code != ResSuccess {
			lastErr = fmt.Errorf("remoting: route of %s: code %d: %s", topic, h.Code, h.Remark)
			continue
		}
		return body, nil
	}
	if lastErr == nil {
		lastErr = errors.New("remoting: no name server configured")
	}
	return nil, lastErr
}

// CreateTopic creates (or updates) topic on the broker at addr with queues
// read and write queues and read-write permission (UPDATE_AND_CREATE_TOPIC),
// as `mqadmin updateTopic` does.
func CreateTopic(ctx context.Context, addr string, timeout time.Duration, topic string, queues int) error {
	h, _, err := RoundTrip(ctx, addr, timeout, ReqCreateTopic, map[string]string{
		"topic":           topic,
		"defaultTopic":    "TBW102",
		"readQueueNums":   strconv.Itoa(queues),
		"writeQueueNums":  strconv.Itoa(queues),
		"perm":            "6",
		"topicFilterType": "SINGLE_TAG",
		"topicSysFlag":    "0",
		"order":           "false",
	})
	if err != nil {
		return err
	}
	if h.Code != ResSuccess {
		return fmt.Errorf("remoting: create topic %s on %s: code %d: %s", topic, addr, h.Code, h.Remark)
	}
	return nil
}
