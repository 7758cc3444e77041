package io.github.rmqtx.interop;

import java.util.List;

import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * A plain Java consumer of rmqtx events, as a Java team writes one: a push consumer that filters
 * by tag (rmqtx puts the event type there) and reads the envelope from the user properties.
 *
 * <p>Usage: Consume NAMESRV TOPIC GROUP TAG_EXPRESSION. Prints READY once started, then one line
 * per delivery: MSG, event id, tag, last key, hash ok, event version, format version. Stops when
 * stdin is closed.
 */
public final class Consume {
    public static void main(String[] args) throws Exception {
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(args[2]);
        consumer.setNamesrvAddr(args[0]);
        consumer.setInstanceName(args[2]);
        consumer.setVipChannelEnabled(false);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(args[1], args[3]);
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                String id = m.getUserProperty(RmqtxWire.EVENT_ID);
                String declared = m.getUserProperty(RmqtxWire.PAYLOAD_SHA256);
                boolean hashOk = declared != null && declared.equalsIgnoreCase(RmqtxWire.sha256Hex(m.getBody(), false));
                List<String> keys = List.of(m.getKeys() == null ? new String[0] : m.getKeys().split(" "));
                String lastKey = keys.isEmpty() ? "" : keys.get(keys.size() - 1);
                Lines.print("MSG", String.valueOf(id), String.valueOf(m.getTags()), lastKey, Boolean.toString(hashOk),
                        String.valueOf(m.getUserProperty(RmqtxWire.EVENT_VERSION)),
                        String.valueOf(m.getUserProperty(RmqtxWire.FORMAT_VERSION)));
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        Lines.print("READY");
        Lines.awaitStdinClosed();
        consumer.shutdown();
    }
}
