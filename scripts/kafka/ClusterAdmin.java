// What the tests ask of a cluster that librdkafka's admin API cannot do:
// name a consumer group's coordinator, and move a partition's leadership
// the way an operator does (a reassignment that puts another replica
// first, then a preferred leader election). Run by `scripts/kafka-node
// admin` as a single-file program against the broker's own client jar.
//
//   coordinator BOOTSTRAP GROUP          prints the coordinator's node id
//   move-leader BOOTSTRAP TOPIC PARTITION
//                                        prints "FROM TO" once TO leads
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;

public class ClusterAdmin {
    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: coordinator BOOTSTRAP GROUP | move-leader BOOTSTRAP TOPIC PARTITION");
            System.exit(2);
        }
        Properties settings = new Properties();
        settings.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[1]);
        settings.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "60000");
        try (Admin admin = Admin.create(settings)) {
            switch (args[0]) {
                case "coordinator" -> System.out.println(coordinator(admin, args[2]));
                case "move-leader" -> System.out.println(moveLeader(admin, args[2], Integer.parseInt(args[3])));
                default -> {
                    System.err.println("unknown command " + args[0]);
                    System.exit(2);
                }
            }
        }
    }

    static int coordinator(Admin admin, String group) throws Exception {
        return admin.describeConsumerGroups(List.of(group)).all().get().get(group).coordinator().id();
    }

    static TopicPartitionInfo describe(Admin admin, String topic, int partition) throws Exception {
        TopicDescription description = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
        return description.partitions().get(partition);
    }

    static String moveLeader(Admin admin, String topic, int partition) throws Exception {
        TopicPartition tp = new TopicPartition(topic, partition);
        TopicPartitionInfo before = describe(admin, topic, partition);
        int from = before.leader().id();
        // The same replicas, another one first: the preferred leader changes
        // and no data moves.
        List<Integer> replicas = new ArrayList<>();
        for (Node node : before.replicas()) {
            replicas.add(node.id());
        }
        int to = replicas.stream().filter(id -> id != from).findFirst().orElseThrow();
        replicas.remove(Integer.valueOf(to));
        replicas.add(0, to);
        admin.alterPartitionReassignments(Map.of(tp, Optional.of(new NewPartitionReassignment(replicas)))).all().get();
        Instant deadline = Instant.now().plus(Duration.ofSeconds(60));
        while (true) {
            try {
                admin.electLeaders(ElectionType.PREFERRED, Set.of(tp)).partitions().get();
            } catch (Exception retried) {
                // The reassignment may not have landed yet: elect again.
            }
            if (describe(admin, topic, partition).leader().id() == to) {
                return from + " " + to;
            }
            if (Instant.now().isAfter(deadline)) {
                throw new IllegalStateException("node " + to + " does not lead " + tp + " after 60 s");
            }
            Thread.sleep(200);
        }
    }
}
