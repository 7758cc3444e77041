package io.github.rmqtx.interop;

import java.util.UUID;

import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;

/**
 * A Java producer that writes the documented rmqtx wire format (RmqtxWire), with aggregate
 * versions, sent out of order on purpose.
 *
 * <p>Usage: WireProducer NAMESRV TOPIC GROUP RUN AGGREGATES VERSIONS. For each aggregate it sends
 * versions VERSIONS..1 (newest first), with the payload hash in upper case. Then: version 1 of the
 * first aggregate again (a resend: same event id, same body), a stale event (a new id claiming
 * version 1), and an event in a future format version (2). Prints WIRE lines and DONE; stops when
 * stdin is closed.
 */
public final class WireProducer {
    public static void main(String[] args) throws Exception {
        String namesrv = args[0], topic = args[1], group = args[2], run = args[3];
        int aggregates = Integer.parseInt(args[4]), versions = Integer.parseInt(args[5]);

        DefaultMQProducer p = new DefaultMQProducer(group);
        p.setNamesrvAddr(namesrv);
        p.setInstanceName(group);
        p.setVipChannelEnabled(false);
        p.start();
        String firstId = null;
        byte[] firstBody = null;
        for (int a = 0; a < aggregates; a++) {
            String box = "box-" + run + "-" + a;
            for (int v = versions; v >= 1; v--) {
                String id = UUID.randomUUID().toString();
                byte[] body = RmqtxWire.utf8("{\"box\":\"" + box + "\",\"v\":" + v + "}");
                send(p, box, v, "event", wire(topic, id, box, v, body));
                if (a == 0 && v == 1) {
                    firstId = id;
                    firstBody = body;
                }
            }
        }
        String box0 = "box-" + run + "-0";
        send(p, box0, 1, "resend", wire(topic, firstId, box0, 1, firstBody));
        send(p, box0, 1, "stale", wire(topic, UUID.randomUUID().toString(), box0, 1, RmqtxWire.utf8("{\"stale\":true}")));
        Message future = wire(topic, UUID.randomUUID().toString(), box0, versions + 1, RmqtxWire.utf8("{\"future\":true}"));
        future.putUserProperty(RmqtxWire.FORMAT_VERSION, "2");
        send(p, box0, versions + 1, "future", future);
        Lines.print("DONE");
        Lines.awaitStdinClosed();
        p.shutdown();
    }

    private static Message wire(String topic, String id, String box, long version, byte[] body) {
        Message msg = RmqtxWire.withAggregate(RmqtxWire.event(topic, id, "BoxMoved", box, body), "Box", box, version);
        // Another client's hex encoder may write upper case: rmqtx normalises on read.
        msg.putUserProperty(RmqtxWire.PAYLOAD_SHA256, RmqtxWire.sha256Hex(body, true));
        return msg;
    }

    private static void send(DefaultMQProducer p, String box, long version, String kind, Message msg) throws Exception {
        SendResult r = p.send(msg);
        Lines.print("WIRE", msg.getUserProperty(RmqtxWire.EVENT_ID), box, Long.toString(version), kind, r.getSendStatus().name());
    }
}
