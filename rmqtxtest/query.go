package rmqtxtest

import "strings"

// handleQueryMessage answers a query by key (QUERY_MESSAGE, what mqadmin
// queryMsgByKey and rmqtx's inspect send): the messages of topic whose KEYS
// or UNIQ_KEY equals key, as the broker's index finds them, up to maxNum.
// The half topic finds every half ever stored, as the real store keeps
// them.
func (b *Broker) handleQueryMessage(req *command) *command {
	topicName, key := req.ext("topic"), req.ext("key")
	max := int(req.extInt("maxNum"))
	if max <= 0 {
		max = 32
	}
	b.lock()
	defer b.unlock()
	var body []byte
	n := 0
	match := func(r *record) {
		if n >= max {
			return
		}
		hit := r.props["UNIQ_KEY"] == key
		for _, k := range strings.Fields(r.props["KEYS"]) {
			hit = hit || k == key
		}
		if hit {
			body = append(body, r.encode(b.storeHost)...)
			n++
		}
	}
	if topicName == halfTopic {
		for _, hf := range b.halves {
			match(hf.rec)
		}
	} else if t := b.topics[topicName]; t != nil {
		for _, q := range t.queues {
			for _, r := range q {
				match(r)
			}
		}
	}
	if n == 0 {
		return newResponse(req, codeQueryNotFound, "can not find message, maybe time range not correct", nil)
	}
	resp := newResponse(req, codeSuccess, "", map[string]string{"indexLastUpdateTimestamp": "0", "indexLastUpdatePhyoffset": "0"})
	resp.Body = body
	return resp
}
