/* A mosquitto plugin (plugin API v5) that refuses SUBSCRIBE to one topic filter, for tests.
 *
 * mosquitto 2.0.11 grants a subscription its acl_file denies (SUBACK 0: `topic deny` and a missing read
 * rule only keep messages from being delivered), so a broker that answers a SUBSCRIBE with a refusal
 * (SUBACK 0x87 "Not authorized" to an MQTT v5 client) needs a plugin. This one refuses the filter given as
 *
 *     plugin /path/to/mosq_deny_plugin.so
 *     plugin_opt_deny_subscribe edged/test-01/cmd/+
 *
 * and allows everything else (a plugin that defers on every check leaves the broker to deny them all).
 * Built by the test with: cc -shared -fPIC -o mosq_deny_plugin.so mosq_deny_plugin.c
 * Needs Debian's mosquitto-dev (mosquitto_broker.h, mosquitto_plugin.h).
 */
#include <stdlib.h>
#include <string.h>

#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>

/* From mosquitto.h (libmosquitto-dev), which mosquitto-dev does not ship: the values of mosquitto 2.0. */
#define DENY_MOSQ_ERR_SUCCESS 0
#define DENY_MOSQ_ERR_NOMEM 1
#define DENY_MOSQ_ERR_INVAL 3
#define DENY_MOSQ_ERR_ACL_DENIED 12
#define DENY_MOSQ_LOG_NOTICE (1 << 1)

static mosquitto_plugin_id_t *plugin_id;
static char *denied;

int mosquitto_plugin_version(int supported_version_count, const int *supported_versions)
{
	for (int i = 0; i < supported_version_count; i++) {
		if (supported_versions[i] == 5) {
			return 5;
		}
	}
	return -1;
}

static int acl_check(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_acl_check *ed = event_data;
	(void)event;
	(void)userdata;
	if (ed->access == MOSQ_ACL_SUBSCRIBE && ed->topic != NULL && strcmp(ed->topic, denied) == 0) {
		mosquitto_log_printf(DENY_MOSQ_LOG_NOTICE, "mosq_deny_plugin: refusing SUBSCRIBE to %s", ed->topic);
		return DENY_MOSQ_ERR_ACL_DENIED;
	}
	return DENY_MOSQ_ERR_SUCCESS;
}

int mosquitto_plugin_init(mosquitto_plugin_id_t *identifier, void **userdata, struct mosquitto_opt *opts, int opt_count)
{
	(void)userdata;
	for (int i = 0; i < opt_count; i++) {
		if (strcmp(opts[i].key, "deny_subscribe") == 0) {
			denied = strdup(opts[i].value);
			if (denied == NULL) {
				return DENY_MOSQ_ERR_NOMEM;
			}
		}
	}
	if (denied == NULL) {
		return DENY_MOSQ_ERR_INVAL; /* plugin_opt_deny_subscribe is required */
	}
	plugin_id = identifier;
	return mosquitto_callback_register(plugin_id, MOSQ_EVT_ACL_CHECK, acl_check, NULL, NULL);
}

int mosquitto_plugin_cleanup(void *userdata, struct mosquitto_opt *opts, int opt_count)
{
	(void)userdata;
	(void)opts;
	(void)opt_count;
	mosquitto_callback_unregister(plugin_id, MOSQ_EVT_ACL_CHECK, acl_check, NULL);
	free(denied);
	denied = NULL;
	return DENY_MOSQ_ERR_SUCCESS;
}
