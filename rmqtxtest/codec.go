package rmqtxtest

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
)

// The remoting protocol, as rocketmq-client-go speaks it: a frame is a
// 4-byte total length, a 4-byte header length whose high byte is the
// serialize type (0: JSON, the only one the client uses by default), the
// JSON header, and the body. Flag bit 0 marks a response, bit 1 a one-way
// request (no response expected).
const (
	flagResponse = 1
	flagOneway   = 2
	maxFrame     = 64 << 20
	// remotingVersion is what the broker reports; the client only stores it.
	remotingVersion = 317
)

// Response codes the client and rmqtx interpret.
const (
	codeSuccess         = 0
	codeSystemError     = 1
	codeNotSupported    = 3
	codeTopicNotExist   = 17
	codePullNotFound    = 19
	codePullRetryNow    = 20
	codePullOffsetMoved = 21
	codeQueryNotFound   = 22
)

// command is one remoting frame, request or response.
type command struct {
	Code      int               `json:"code"`
	Language  string            `json:"language"`
	Version   int               `json:"version"`
	Opaque    int32             `json:"opaque"`
	Flag      int               `json:"flag"`
	Remark    string            `json:"remark,omitempty"`
	ExtFields map[string]string `json:"extFields"`
	Body      []byte            `json:"-"`
}

func (c *command) oneway() bool   { return c.Flag&flagOneway != 0 }
func (c *command) response() bool { return c.Flag&flagResponse != 0 }

// ext returns an extension field ("" when absent).
func (c *command) ext(k string) string { return c.ExtFields[k] }

func (c *command) extInt(k string) int64 {
	v, _ := strconv.ParseInt(c.ExtFields[k], 10, 64)
	return v
}

func (c *command) extBool(k string) bool {
	v, _ := strconv.ParseBool(c.ExtFields[k])
	return v
}

// newResponse answers req with code and remark; ext may be nil.
func newResponse(req *command, code int, remark string, ext map[string]string) *command {
	if ext == nil {
		ext = map[string]string{}
	}
	return &command{Code: code, Language: "JAVA", Version: remotingVersion, Opaque: req.Opaque, Flag: flagResponse, Remark: remark, ExtFields: ext}
}

var errBadFrame = errors.New("rmqtxtest: bad remoting frame")

// readCommand reads one frame from r.
func readCommand(r io.Reader) (*command, error) {
	var lb [4]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(lb[:])
	if n < 4 || n > maxFrame {
		return nil, fmt.Errorf("%w: length %d", errBadFrame, n)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	mark := binary.BigEndian.Uint32(buf[:4])
	if mark>>24 != 0 {
		return nil, fmt.Errorf("%w: serialize type %d (only JSON is served)", errBadFrame, mark>>24)
	}
	hl := int(mark & 0xFFFFFF)
	if 4+hl > len(buf) {
		return nil, fmt.Errorf("%w: header length %d", errBadFrame, hl)
	}
	c := &command{}
	if err := json.Unmarshal(buf[4:4+hl], c); err != nil {
		return nil, fmt.Errorf("%w: header: %w", errBadFrame, err)
	}
	if c.ExtFields == nil {
		c.ExtFields = map[string]string{}
	}
	c.Body = buf[4+hl:]
	return c, nil
}

// encode returns c as one frame.
func (c *command) encode() ([]byte, error) {
	if c.ExtFields == nil {
		c.ExtFields = map[string]string{}
	}
	h, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("rmqtxtest: encode header: %w", err)
	}
	frame := make([]byte, 8, 8+len(h)+len(c.Body))
	binary.BigEndian.PutUint32(frame[0:4], uint32(4+len(h)+len(c.Body)))
	binary.BigEndian.PutUint32(frame[4:8], uint32(len(h))&0xFFFFFF)
	frame = append(frame, h...)
	frame = append(frame, c.Body...)
	return frame, nil
}

// Message properties travel as "k\x01v\x02" pairs (primitive.Message).
const (
	nameValueSep = '\x01'
	propertySep  = '\x02'
)

func parseProperties(s string) map[string]string {
	out := map[string]string{}
	for _, item := range strings.Split(s, string(propertySep)) {
		k, v, ok := strings.Cut(item, string(nameValueSep))
		if ok && k != "" && !strings.ContainsRune(v, nameValueSep) {
			out[k] = v
		}
	}
	return out
}

// propertiesString writes props with sorted keys, so that a stored
// message's encoding does not depend on map order.
func propertiesString(props map[string]string) string {
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(nameValueSep)
		b.WriteString(props[k])
		b.WriteByte(propertySep)
	}
	return b.String()
}

// Message system flags (primitive/message.go, MessageSysFlag).
const (
	sysFlagCompressed = 0x1
	sysFlagTxMask     = 0x3 << 2
	sysFlagPrepared   = 0x1 << 2
	sysFlagCommit     = 0x2 << 2
	sysFlagRollback   = 0x3 << 2
)

// messageMagic is the store's magic code (MessageDecoder.MESSAGE_MAGIC_CODE).
const messageMagic = 0xdaa320a7

// hostPort is an IPv4 address and port as the store encodes them.
type hostPort struct {
	ip   [4]byte
	port int32
}

func hostPortOf(a net.Addr) hostPort {
	var hp hostPort
	if t, ok := a.(*net.TCPAddr); ok {
		if v4 := t.IP.To4(); v4 != nil {
			copy(hp.ip[:], v4)
		}
		hp.port = int32(t.Port)
	}
	return hp
}

// record is one stored message: a queue entry, a half, a retry or a
// discarded half. Its fields are what the store encodes for a consumer.
type record struct {
	topic          string
	queueID        int
	queueOffset    int64
	commitOffset   int64
	sysFlag        int32
	flag           int32
	bornTimestamp  int64
	bornHost       hostPort
	storeTimestamp int64
	reconsumeTimes int32
	preparedOffset int64
	body           []byte
	props          map[string]string
	dueAt          int64 // broker-clock ms a delayed retry becomes visible (KeepRetryDelays)
}

// clone copies r with its own properties map (body shared: never mutated).
func (r *record) clone() *record {
	c := *r
	c.props = make(map[string]string, len(r.props))
	for k, v := range r.props {
		c.props[k] = v
	}
	return &c
}

// encodedSize is the size the store gives r (it also advances the commit
// log offset, as in the real store).
func (r *record) encodedSize() int {
	return 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + len(r.body) + 1 + len(r.topic) + 2 + len(propertiesString(r.props))
}

// encode writes r in the store's message format, which
// primitive.DecodeMessage reads from a pull or check body.
func (r *record) encode(storeHost hostPort) []byte {
	props := []byte(propertiesString(r.props))
	topic := r.topic
	if len(topic) > 255 {
		topic = topic[:255]
	}
	size := r.encodedSize()
	b := make([]byte, 0, size)
	b = binary.BigEndian.AppendUint32(b, uint32(size))
	b = binary.BigEndian.AppendUint32(b, messageMagic)
	b = binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(r.body))
	b = binary.BigEndian.AppendUint32(b, uint32(r.queueID))
	b = binary.BigEndian.AppendUint32(b, uint32(r.flag))
	b = binary.BigEndian.AppendUint64(b, uint64(r.queueOffset))
	b = binary.BigEndian.AppendUint64(b, uint64(r.commitOffset))
	b = binary.BigEndian.AppendUint32(b, uint32(r.sysFlag))
	b = binary.BigEndian.AppendUint64(b, uint64(r.bornTimestamp))
	b = append(b, r.bornHost.ip[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(r.bornHost.port))
	b = binary.BigEndian.AppendUint64(b, uint64(r.storeTimestamp))
	b = append(b, storeHost.ip[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(storeHost.port))
	b = binary.BigEndian.AppendUint32(b, uint32(r.reconsumeTimes))
	b = binary.BigEndian.AppendUint64(b, uint64(r.preparedOffset))
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.body)))
	b = append(b, r.body...)
	b = append(b, byte(len(topic)))
	b = append(b, topic...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(props)))
	b = append(b, props...)
	return b
}

// offsetMsgID is the broker's message id: store host and commit log
// offset, upper-case hex (primitive.CreateMessageId). rmqtx reads the
// offset back from it (primitive.UnmarshalMsgID) to end a transaction.
func offsetMsgID(store hostPort, offset int64) string {
	b := make([]byte, 0, 16)
	b = append(b, store.ip[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(store.port))
	b = binary.BigEndian.AppendUint64(b, uint64(offset))
	return strings.ToUpper(hex.EncodeToString(b))
}

// offsetOfMsgID returns the commit log offset in an offset message id.
func offsetOfMsgID(id string) (int64, bool) {
	if len(id) != 32 {
		return 0, false
	}
	raw, err := hex.DecodeString(id)
	if err != nil {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(raw[8:16])), true
}

// batchMessage is one message of a SEND_BATCH_MESSAGE body.
type batchMessage struct {
	flag  int32
	body  []byte
	props map[string]string
}

// decodeBatch reads a batch body: each message is TOTALSIZE, MAGIC,
// BODYCRC, FLAG, BODYSIZE, BODY, PROPERTYSIZE (2 bytes), PROPERTIES
// (producer.MarshalMessageBatch).
func decodeBatch(b []byte) ([]batchMessage, error) {
	var out []batchMessage
	for len(b) > 0 {
		if len(b) < 20 {
			return nil, fmt.Errorf("%w: short batch message", errBadFrame)
		}
		size := int(binary.BigEndian.Uint32(b[0:4]))
		if size < 22 || size > len(b) {
			return nil, fmt.Errorf("%w: batch message size %d", errBadFrame, size)
		}
		m := b[:size]
		flag := int32(binary.BigEndian.Uint32(m[12:16]))
		bl := int(binary.BigEndian.Uint32(m[16:20]))
		if 20+bl+2 > size {
			return nil, fmt.Errorf("%w: batch body size %d", errBadFrame, bl)
		}
		body := append([]byte(nil), m[20:20+bl]...)
		pl := int(binary.BigEndian.Uint16(m[20+bl : 22+bl]))
		if 22+bl+pl > size {
			return nil, fmt.Errorf("%w: batch properties size %d", errBadFrame, pl)
		}
		out = append(out, batchMessage{flag: flag, body: body, props: parseProperties(string(m[22+bl : 22+bl+pl]))})
		b = b[size:]
	}
	return out, nil
}

// plainBody returns a stored body uncompressed (the client compresses
// large bodies with zlib and sets the compressed flag).
func plainBody(r *record) []byte {
	if r.sysFlag&sysFlagCompressed == 0 {
		return append([]byte(nil), r.body...)
	}
	zr, err := zlib.NewReader(bytes.NewReader(r.body))
	if err != nil {
		return append([]byte(nil), r.body...)
	}
	defer zr.Close()
	out, err := io.ReadAll(zr)
	if err != nil {
		return append([]byte(nil), r.body...)
	}
	return out
}
