/* placeholder: replaced by the bandwidth probe */
int main(void) { return 0; }
