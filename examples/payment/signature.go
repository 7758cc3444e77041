package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader carries the gateway's signature of a callback:
// "t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>". Signing the
// timestamp with the body lets the receiver refuse old, replayed requests.
const SignatureHeader = "X-Pay-Signature"

// MaxSignatureAge is how far a callback's timestamp may be from our clock.
const MaxSignatureAge = 5 * time.Minute

var (
	errSignatureMissing = errors.New("signature header missing or malformed")
	errSignatureBad     = errors.New("signature does not match the body")
	errSignatureOld     = errors.New("signature timestamp outside the allowed window")
)

// Sign returns the signature header value for body at time now.
func Sign(secret []byte, body []byte, now time.Time) string {
	ts := strconv.FormatInt(now.Unix(), 10)
	return "t=" + ts + ",v1=" + mac(secret, ts, body)
}

func mac(secret []byte, ts string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte("."))
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// Verify checks header against body: a well-formed header, a matching
// HMAC (compared in constant time) and a timestamp within MaxSignatureAge.
func Verify(secret []byte, header string, body []byte, now time.Time) error {
	var ts, sig string
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return errSignatureMissing
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			sig = v
		}
	}
	if ts == "" || sig == "" {
		return errSignatureMissing
	}
	want, err := hex.DecodeString(sig)
	if err != nil {
		return errSignatureMissing
	}
	got, _ := hex.DecodeString(mac(secret, ts, body))
	if !hmac.Equal(got, want) {
		return errSignatureBad
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errSignatureMissing
	}
	if d := now.Sub(time.Unix(sec, 0)); d > MaxSignatureAge || d < -MaxSignatureAge {
		return fmt.Errorf("%w (%s)", errSignatureOld, d.Round(time.Second))
	}
	return nil
}
